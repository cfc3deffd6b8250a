package zfscmd

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"

	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs"
)

// Cmd implements zfs.Encryption: the passphrase goes to zfs on its standard
// input (keylocation=prompt reads it from there when it is not a
// terminal), so it never reaches a file, an argument or a log.
var _ zfs.Encryption = Cmd{}

// CreateEncrypted creates filesystem name with props as its own
// encryption root (keyformat passphrase, keylocation prompt).
func (c Cmd) CreateEncrypted(ctx context.Context, name string, props map[string]string, passphrase []byte) error {
	if err := zfs.ValidateName(name); err != nil || strings.Contains(name, "@") {
		return fmt.Errorf("refusing to create %q: not a filesystem name", name)
	}
	args := []string{"create"}
	for _, k := range sortedKeys(props) {
		args = append(args, "-o", k+"="+props[k])
	}
	args = append(args, "-o", "keyformat=passphrase", "-o", "keylocation=prompt", name)
	_, err := c.runWithInput(ctx, passphrase, args...)
	return err
}

// CopyEncrypted copies the encrypted snapshot into the new filesystem
// target, as zfs send -w | zfs receive -u: the stream stays raw, so no
// key is needed and the copy is its own encryption root with the same
// key. The received snapshot is destroyed: the copy is a new volume, not
// a holder of its source's snapshot. Not resumable (no -s): a failed
// receive leaves nothing behind.
func (c Cmd) CopyEncrypted(ctx context.Context, snapshot, target string, props map[string]string) error {
	if err := zfs.ValidateName(snapshot); err != nil || !strings.Contains(snapshot, "@") {
		return fmt.Errorf("refusing to copy %q: not a snapshot name", snapshot)
	}
	if err := zfs.ValidateName(target); err != nil || strings.Contains(target, "@") {
		return fmt.Errorf("refusing to copy into %q: not a filesystem name", target)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sendArgs := []string{"send", "-w", snapshot}
	recvArgs := []string{"receive", "-u"}
	for _, k := range sortedKeys(props) {
		recvArgs = append(recvArgs, "-o", k+"="+props[k])
	}
	recvArgs = append(recvArgs, target)
	var sendErr, recvErr bytes.Buffer
	send := exec.CommandContext(ctx, c.bin(), sendArgs...)
	recv := exec.CommandContext(ctx, c.bin(), recvArgs...)
	send.Stderr, recv.Stderr = &sendErr, &recvErr
	stream, err := send.StdoutPipe()
	if err != nil {
		return err
	}
	recv.Stdin = stream
	if err := send.Start(); err != nil {
		return fmt.Errorf("starting zfs send: %w", err)
	}
	// The pipe's read end is zfs receive's alone once it runs: kept open
	// here too, a receive that fails would leave zfs send blocked on a
	// pipe nobody reads, where no signal stops it (see Send).
	err = recv.Start()
	stream.Close()
	if err == nil {
		err = recv.Wait()
	}
	if err != nil {
		cancel() // the receiver is gone: stop the sender
		_ = send.Wait()
		return classify(fmt.Errorf("zfs %s: %w: %s", strings.Join(recvArgs, " "), err, strings.TrimSpace(recvErr.String())), recvErr.String())
	}
	if err := send.Wait(); err != nil {
		return classify(fmt.Errorf("zfs %s: %w: %s", strings.Join(sendArgs, " "), err, strings.TrimSpace(sendErr.String())), sendErr.String())
	}
	_, snapName, _ := strings.Cut(snapshot, "@")
	return c.DestroySnapshot(ctx, target+"@"+snapName)
}

// LoadKey loads the key of encryption root fs.
func (c Cmd) LoadKey(ctx context.Context, fs string, passphrase []byte) error {
	if err := zfs.ValidateName(fs); err != nil {
		return err
	}
	_, err := c.runWithInput(ctx, passphrase, "load-key", fs)
	if err != nil && strings.Contains(err.Error(), "already loaded") {
		return nil
	}
	return err
}

// CheckKey checks passphrase against the key of encryption root fs, as
// zfs load-key -n: it derives the key and tries it, loaded or not, and
// loads nothing.
func (c Cmd) CheckKey(ctx context.Context, fs string, passphrase []byte) error {
	if err := zfs.ValidateName(fs); err != nil {
		return err
	}
	_, err := c.runWithInput(ctx, passphrase, "load-key", "-n", fs)
	return err
}

// UnloadKey unloads the key of encryption root fs.
func (c Cmd) UnloadKey(ctx context.Context, fs string) error {
	if err := zfs.ValidateName(fs); err != nil {
		return err
	}
	_, err := c.run(ctx, "unload-key", fs)
	switch {
	case err == nil, strings.Contains(err.Error(), "already unloaded"):
		return nil
	case strings.Contains(err.Error(), "is busy"):
		return fmt.Errorf("%w: %w", err, zfs.ErrBusy)
	}
	return err
}
