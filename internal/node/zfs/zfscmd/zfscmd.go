// Package zfscmd runs the zfs command for what must not hold a libzfs
// handle (a handle serves one call at a time, and the node keeps a few):
// send and receive streams, which last minutes. Each call is its own
// process, so a long transfer never stalls other volumes. It also does
// what needs a key (keys.go): libzfs reads key material only from a
// prompt or a file. It also has the reads and holds around the streams,
// which the node runs in process instead (libzfs) and tests use
// to check that both agree.
package zfscmd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"sort"
	"strconv"
	"strings"

	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs"
)

// Cmd runs the zfs binary (Path, default "zfs").
type Cmd struct {
	Path string
}

func (c Cmd) bin() string {
	if c.Path == "" {
		return "zfs"
	}
	return c.Path
}

// run runs zfs with args and returns stdout; stderr goes into the error.
func (c Cmd) run(ctx context.Context, args ...string) (string, error) {
	return c.runWithInput(ctx, nil, args...)
}

// runWithInput runs zfs with args and input (nil: none) on its standard
// input, and returns stdout; stderr goes into the error.
func (c Cmd) runWithInput(ctx context.Context, input []byte, args ...string) (string, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, c.bin(), args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if input != nil {
		cmd.Stdin = bytes.NewReader(input)
	}
	if err := cmd.Run(); err != nil {
		return "", classify(fmt.Errorf("zfs %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String())), stderr.String())
	}
	return stdout.String(), nil
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func classify(err error, stderr string) error {
	switch {
	case strings.Contains(stderr, "stream has unsupported feature"):
		// libzfs's check of the first record's feature flags. Not the
		// kernel's "must be upgraded to receive this stream" (ENOTSUP):
		// a corrupted stream gets that too, and with the userland and
		// module of one release (openzfs.Check) libzfs refuses first.
		return fmt.Errorf("%w: %w", err, zfs.ErrStreamUnsupported)
	case strings.Contains(stderr, "out of space"), strings.Contains(stderr, "quota exceeded"):
		// ENOSPC, and EDQUOT (zfs receive: "destination D space quota
		// exceeded").
		return fmt.Errorf("%w: %w", err, zfs.ErrNoSpace)
	case strings.Contains(stderr, "Incorrect key provided"):
		return fmt.Errorf("%w: %w", err, zfs.ErrWrongKey)
	case strings.Contains(stderr, "does not exist"), strings.Contains(stderr, "no such"):
		return fmt.Errorf("%w: %w", err, zfs.ErrNotFound)
	case strings.Contains(stderr, "already exists"):
		return fmt.Errorf("%w: %w", err, zfs.ErrExists)
	}
	return err
}

// SendArgs returns the zfs send arguments of s: large blocks and
// compressed blocks as stored (-L -c), so data is neither split nor
// recompressed; raw (-w, which implies both) for encrypted datasets.
func SendArgs(s zfs.SendSpec) []string {
	if s.ResumeToken != "" {
		return []string{"send", "-t", s.ResumeToken} // the token carries the original flags
	}
	args := []string{"send", "-L", "-c"}
	if s.Raw {
		args = []string{"send", "-w"}
	}
	if s.Base != "" {
		args = append(args, "-i", s.Base)
	}
	return append(args, s.Snapshot)
}

// Send runs zfs send and copies the stream to w. It returns the bytes
// written; an error from w stops the sender.
//
// A sender is stopped by closing the pipe's read end, not by a signal
// alone: on Linux the kernel writes the stream into the pipe from a taskq
// thread, which no signal reaches, while the killed process waits for it
// uninterruptibly (openzfs/zfs#12500). Killed with the read end still
// open and unread, zfs send would never end, and neither would Wait, the
// push holding the volume's transfer, or the move waiting for it.
func (c Cmd) Send(ctx context.Context, spec zfs.SendSpec, w io.Writer) (int64, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, c.bin(), SendArgs(spec)...)
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, err
	}
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("starting zfs send: %w", err)
	}
	n, copyErr := io.Copy(w, out)
	if copyErr != nil {
		// The receiver is gone: stop the sender, and let the kernel's
		// write fail (EPIPE) so that the process can end.
		cancel()
		out.Close()
	}
	waitErr := cmd.Wait()
	if copyErr != nil {
		return n, fmt.Errorf("streaming zfs %s: %w", strings.Join(SendArgs(spec), " "), copyErr)
	}
	if waitErr != nil {
		return n, classify(fmt.Errorf("zfs %s: %w: %s", strings.Join(SendArgs(spec), " "), waitErr, strings.TrimSpace(stderr.String())), stderr.String())
	}
	return n, nil
}

// EstimateSize returns the size zfs send -nP predicts for spec.
func (c Cmd) EstimateSize(ctx context.Context, spec zfs.SendSpec) (int64, error) {
	args := SendArgs(spec)
	args = append([]string{"send", "-n", "-P"}, args[1:]...)
	out, err := c.run(ctx, args...)
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "size" {
			return strconv.ParseInt(f[1], 10, 64)
		}
	}
	return 0, fmt.Errorf("zfs send -nP printed no size")
}

// ChildProperties lists the filesystems directly below parent with props.
func (c Cmd) ChildProperties(ctx context.Context, parent string, props ...string) ([]zfs.Child, error) {
	out, err := c.run(ctx, "list", "-H", "-p", "-d", "1", "-t", "filesystem", "-o", "name,"+strings.Join(props, ","), parent)
	if err != nil {
		return nil, err
	}
	var children []zfs.Child
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Split(line, "\t")
		if len(f) != len(props)+1 || f[0] == parent {
			continue
		}
		ch := zfs.Child{Name: f[0], Props: map[string]string{}}
		for i, p := range props {
			ch.Props[p] = f[i+1]
		}
		children = append(children, ch)
	}
	return children, nil
}

// Receive runs zfs receive -s -u into target (resumable, never mounted),
// setting props (-o) on a full receive, and reads the stream from r.
func (c Cmd) Receive(ctx context.Context, target string, props map[string]string, r io.Reader) error {
	if err := zfs.ValidateName(target); err != nil {
		return err
	}
	args := []string{"receive", "-s", "-u"}
	for _, k := range sortedKeys(props) {
		args = append(args, "-o", k+"="+props[k])
	}
	args = append(args, target)
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, c.bin(), args...)
	cmd.Stdin, cmd.Stderr = r, &stderr
	if err := cmd.Run(); err != nil {
		return classify(fmt.Errorf("zfs %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String())), stderr.String())
	}
	return nil
}

// SetProperties sets properties on a dataset.
func (c Cmd) SetProperties(ctx context.Context, dataset string, props map[string]string) error {
	if err := zfs.ValidateName(dataset); err != nil {
		return err
	}
	args := []string{"set"}
	for _, k := range sortedKeys(props) {
		args = append(args, k+"="+props[k])
	}
	_, err := c.run(ctx, append(args, dataset)...)
	return err
}

// Rename renames a filesystem with its snapshots.
func (c Cmd) Rename(ctx context.Context, from, to string) error {
	for _, n := range []string{from, to} {
		if err := zfs.ValidateName(n); err != nil {
			return err
		}
	}
	_, err := c.run(ctx, "rename", from, to)
	return err
}

// Rollback reverts a filesystem to one of its snapshots, destroying the
// snapshots after it (zfs rollback -r); held ones make it fail.
func (c Cmd) Rollback(ctx context.Context, snapshot string) error {
	if err := zfs.ValidateName(snapshot); err != nil {
		return err
	}
	if !strings.Contains(snapshot, "@") {
		return fmt.Errorf("invalid snapshot name %q: rollback needs a snapshot", snapshot)
	}
	_, err := c.run(ctx, "rollback", "-r", snapshot)
	return err
}

// AbortReceive discards the partial state of an interrupted receive.
func (c Cmd) AbortReceive(ctx context.Context, target string) error {
	_, err := c.run(ctx, "receive", "-A", target)
	return err
}

// Snapshots lists the snapshots of one filesystem, oldest first.
func (c Cmd) Snapshots(ctx context.Context, fs string) ([]zfs.Snap, error) {
	if err := zfs.ValidateName(fs); err != nil {
		return nil, err
	}
	out, err := c.run(ctx, "list", "-H", "-p", "-t", "snapshot", "-d", "1", "-s", "createtxg", "-o", "name,guid,createtxg,creation,defer_destroy", fs)
	if err != nil {
		return nil, err
	}
	var snaps []zfs.Snap
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Split(line, "\t")
		if len(f) != 5 {
			continue
		}
		guid, err1 := strconv.ParseUint(f[1], 10, 64)
		txg, err2 := strconv.ParseUint(f[2], 10, 64)
		created, err3 := strconv.ParseInt(f[3], 10, 64)
		if err := errors.Join(err1, err2, err3); err != nil {
			return nil, fmt.Errorf("zfs list: unexpected line %q: %w", line, err)
		}
		snaps = append(snaps, zfs.Snap{Name: f[0], GUID: guid, CreateTXG: txg, Created: created, Deferred: f[4] == "on" || f[4] == "1"})
	}
	return snaps, nil
}

// Property reads one property's value ("-" when unset).
func (c Cmd) Property(ctx context.Context, dataset, prop string) (string, error) {
	out, err := c.run(ctx, "get", "-H", "-p", "-o", "value", prop, dataset)
	return strings.TrimSpace(out), err
}

// Properties reads several properties in one call; unset ones are "-".
func (c Cmd) Properties(ctx context.Context, dataset string, props ...string) (map[string]string, error) {
	out, err := c.run(ctx, "get", "-H", "-p", "-o", "property,value", strings.Join(props, ","), dataset)
	if err != nil {
		return nil, err
	}
	values := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if k, v, ok := strings.Cut(line, "\t"); ok {
			values[k] = v
		}
	}
	return values, nil
}

// Snapshot creates a snapshot with user properties.
func (c Cmd) Snapshot(ctx context.Context, name string, props map[string]string) error {
	if err := zfs.ValidateName(name); err != nil {
		return err
	}
	args := []string{"snapshot"}
	for _, k := range sortedKeys(props) {
		args = append(args, "-o", k+"="+props[k])
	}
	_, err := c.run(ctx, append(args, name)...)
	return err
}

// Hold puts hold tag on snapshot; holding twice is fine.
func (c Cmd) Hold(ctx context.Context, snapshot, tag string) error {
	_, err := c.run(ctx, "hold", tag, snapshot)
	if err != nil && strings.Contains(err.Error(), "tag already exists") {
		return nil
	}
	return err
}

// Release removes hold tag from snapshot; a missing hold is fine.
func (c Cmd) Release(ctx context.Context, snapshot, tag string) error {
	_, err := c.run(ctx, "release", tag, snapshot)
	if err != nil && strings.Contains(err.Error(), "no such tag") {
		return nil
	}
	return err
}

// Holds returns the hold tags of every snapshot of fs that has any.
func (c Cmd) Holds(ctx context.Context, fs string) (map[string][]string, error) {
	snaps, err := c.Snapshots(ctx, fs)
	if err != nil || len(snaps) == 0 {
		return nil, err
	}
	args := []string{"holds", "-H"}
	for _, s := range snaps {
		args = append(args, s.Name)
	}
	out, err := c.run(ctx, args...)
	if err != nil {
		return nil, err
	}
	holds := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if f := strings.Split(line, "\t"); len(f) >= 2 {
			holds[f[0]] = append(holds[f[0]], f[1])
		}
	}
	return holds, nil
}

// DestroyRecursive destroys a filesystem and its snapshots.
func (c Cmd) DestroyRecursive(ctx context.Context, fs string) error {
	if err := zfs.ValidateName(fs); err != nil || strings.Contains(fs, "@") || !strings.Contains(fs, "/") {
		return fmt.Errorf("refusing to destroy %q recursively: not a filesystem below a pool", fs)
	}
	_, err := c.run(ctx, "destroy", "-r", fs)
	return err
}

// DestroySnapshot destroys one snapshot, and refuses any other name.
func (c Cmd) DestroySnapshot(ctx context.Context, snapshot string) error {
	if err := zfs.ValidateName(snapshot); err != nil || !strings.Contains(snapshot, "@") {
		return fmt.Errorf("refusing to destroy %q: not a snapshot name", snapshot)
	}
	_, err := c.run(ctx, "destroy", snapshot)
	return err
}
