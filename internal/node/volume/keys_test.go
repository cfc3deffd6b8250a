package volume

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/zfs-nomad/zfs-nomad/internal/node/copyrecord"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs/zfsfake"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/config"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

const passphrase = "correct horse battery"

func newKeyManager(t *testing.T) (*Manager, *zfsfake.Fake) {
	t.Helper()
	m, fake := newManager(t)
	m.cfg.Properties["encryption"] = config.PropertyRule{Allowed: []string{"on", "off"}}
	m.Encryption = fake
	return m, fake
}

func TestEncryptedCreateNeedsAGoodKeyAndLeavesItUnloaded(t *testing.T) {
	keyFile := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(keyFile, []byte("from the key file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		given    contract.Passphrase
		keyFile  string
		noKeys   bool   // a node without key support
		wantKey  string // the key that opens it; "" when the create fails
		wantErr  error
		wantText string
	}{
		{name: "key from the secrets", given: contract.Passphrase(passphrase), wantKey: passphrase},
		{name: "secrets win over the key file", given: contract.Passphrase(passphrase), keyFile: keyFile, wantKey: passphrase},
		{name: "key file without a newline", keyFile: keyFile, wantKey: "from the key file"},
		{name: "no key", wantErr: errdefs.ErrInvalidArgument, wantText: "carry no encryption_key and node n1 names no encryption_key_file"},
		{name: "short key", given: contract.Passphrase("short"), wantErr: errdefs.ErrInvalidArgument, wantText: "8 to 512 bytes on one line (it has 5 bytes)"},
		{name: "two lines", given: contract.Passphrase("first line\nsecond"), wantErr: errdefs.ErrInvalidArgument, wantText: "on one line"},
		{name: "unreadable key file", keyFile: keyFile + ".missing", wantErr: errdefs.ErrFailedPrecondition, wantText: "the key file " + keyFile + ".missing, which cannot be read"},
		{name: "node without key support", given: contract.Passphrase(passphrase), noKeys: true, wantErr: errdefs.ErrFailedPrecondition, wantText: "cannot create encrypted volumes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, fake := newKeyManager(t)
			m.cfg.EncryptionKeyFile = tt.keyFile
			if tt.noKeys {
				m.Encryption = nil
			}
			v, err := m.Create(context.Background(), CreateRequest{Name: "secret", Parameters: map[string]string{"encryption": "on"}, Passphrase: tt.given})
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) || !strings.Contains(err.Error(), tt.wantText) {
					t.Fatalf("got %v, want %v saying %q", err, tt.wantErr, tt.wantText)
				}
				if strings.Contains(err.Error(), passphrase) {
					t.Errorf("the error carries the passphrase: %v", err)
				}
				wantOnlyRoot(t, fake, "a refused create")
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !v.Encrypted || !v.KeyRoot || v.KeyLoaded {
				t.Fatalf("created volume: encrypted %v, own root %v, key loaded %v; want encrypted, its own root, key unloaded", v.Encrypted, v.KeyRoot, v.KeyLoaded)
			}
			if err := fake.LoadKey(context.Background(), v.Dataset, []byte(tt.wantKey)); err != nil {
				t.Errorf("the volume does not open with %q: %v", tt.wantKey, err)
			}
		})
	}
}

func TestOpenKeyLoadsOnlyTheRightKeyAndCloseKeyUnloads(t *testing.T) {
	ctx := context.Background()
	m, _ := newKeyManager(t)
	v := create(t, m, CreateRequest{Name: "secret", Parameters: map[string]string{"encryption": "on"}, Passphrase: contract.Passphrase(passphrase)})

	_, err := m.OpenKey(ctx, v, contract.Passphrase("wrong passphrase"))
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "does not unlock it; nothing was mounted") {
		t.Fatalf("wrong key: got %v, want InvalidArgument saying it does not unlock", err)
	}
	if v, _ = m.Get(ctx, v.ID); v.KeyLoaded {
		t.Fatal("a wrong key left the key loaded")
	}
	if _, err := m.OpenKey(ctx, v, nil); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("no key: got %v, want InvalidArgument", err)
	}
	opened, err := m.OpenKey(ctx, v, contract.Passphrase(passphrase))
	if err != nil || !opened {
		t.Fatalf("right key: opened %v, %v", opened, err)
	}
	if v, _ = m.Get(ctx, v.ID); !v.KeyLoaded {
		t.Fatal("the right key is not loaded")
	}
	if opened, err := m.OpenKey(ctx, v, nil); err != nil || opened {
		t.Fatalf("a loaded key needs no passphrase: opened %v, %v", opened, err)
	}

	m.Mounted = func(string) (bool, error) { return true, nil }
	if err := m.CloseKey(ctx, v.ID); err != nil {
		t.Fatal(err)
	}
	if v, _ = m.Get(ctx, v.ID); !v.KeyLoaded {
		t.Fatal("CloseKey unloaded the key of a volume still mounted")
	}
	m.Mounted = func(string) (bool, error) { return false, nil }
	for range 2 { // unloading twice is no error
		if err := m.CloseKey(ctx, v.ID); err != nil {
			t.Fatal(err)
		}
	}
	if v, _ = m.Get(ctx, v.ID); v.KeyLoaded {
		t.Fatal("CloseKey left the key loaded")
	}
}

func TestAnUnencryptedVolumeNeedsNoKey(t *testing.T) {
	m, _ := newKeyManager(t)
	v := create(t, m, CreateRequest{Name: "plain"})
	if v.Encrypted {
		t.Fatal("a volume that did not ask for encryption is encrypted")
	}
	if opened, err := m.OpenKey(context.Background(), v, nil); err != nil || opened {
		t.Fatalf("OpenKey of a plain volume: opened %v, %v", opened, err)
	}
	if err := m.CloseKey(context.Background(), v.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Create(context.Background(), CreateRequest{Name: "plain2", Parameters: map[string]string{"encryption": "off"}}); err != nil {
		t.Fatalf("encryption=off needs no key: %v", err)
	}
}

// TestRestoresAndClonesKeepTheirSourcesEncryption: a volume made from an
// encrypted snapshot or volume is a raw copy, its own encryption root
// with the same key, key not loaded, and no clone of its source; one
// whose parameters ask for the other encryption is refused; the
// operator's default does not apply to it.
func TestRestoresAndClonesKeepTheirSourcesEncryption(t *testing.T) {
	ctx := context.Background()
	m, fake := newKeyManager(t)
	m.cfg.Properties["encryption"] = config.PropertyRule{Default: "on", Allowed: []string{"on", "off"}}
	src := create(t, m, CreateRequest{Name: "secret", Passphrase: contract.Passphrase(passphrase)})
	plain := create(t, m, CreateRequest{Name: "plain", Parameters: map[string]string{"encryption": "off"}})
	if !src.Encrypted || plain.Encrypted {
		t.Fatalf("encrypted: secret %v (want true, the operator's default), plain %v", src.Encrypted, plain.Encrypted)
	}
	snap := snapshot(t, m, src.ID, "secret-snap")
	for _, req := range []CreateRequest{
		{Name: "restored", SourceSnapshotID: snap.ID},
		{Name: "restored-asking", SourceSnapshotID: snap.ID, Parameters: map[string]string{"encryption": "on"}},
		{Name: "cloned", SourceVolumeID: src.ID},
	} {
		v := create(t, m, req)
		ds, err := fake.Get(ctx, v.Dataset)
		if err != nil {
			t.Fatal(err)
		}
		if !v.Encrypted || !v.KeyRoot || v.KeyLoaded || ds.Origin != "" {
			t.Errorf("%s: encrypted %v, own root %v, key loaded %v, origin %q; want an encrypted copy, its own root, key unloaded, no origin", req.Name, v.Encrypted, v.KeyRoot, v.KeyLoaded, ds.Origin)
		}
		if err := fake.LoadKey(ctx, v.Dataset, []byte(passphrase)); err != nil {
			t.Errorf("%s does not open with its source's key: %v", req.Name, err)
		}
		if names, _ := fake.SnapshotNames(ctx, v.Dataset); len(names) > 0 {
			t.Errorf("%s holds snapshots %v, want none", req.Name, names)
		}
	}
	_, err := m.Create(ctx, CreateRequest{Name: "restored-plain", SourceSnapshotID: snap.ID, Parameters: map[string]string{"encryption": "off"}})
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "keeps its encryption (encrypted)") {
		t.Fatalf("a restore asking for encryption=off: %v, want InvalidArgument", err)
	}
	v := create(t, m, CreateRequest{Name: "plain-clone", SourceVolumeID: plain.ID})
	if v.Encrypted {
		t.Error("a clone of a plain volume is encrypted: the operator's default applied to it")
	}
}

// TestPromotionLeavesTheEncryptionAsReceived: a promotion sets the
// volume's properties again on the received copy, but not encryption,
// which ZFS sets only at creation (the raw stream brought it).
func TestPromotionLeavesTheEncryptionAsReceived(t *testing.T) {
	ctx := context.Background()
	m, fake := newKeyManager(t)
	id, _ := receivedReplica(t, fake, 1, map[string]string{copyrecord.PropParameters: `{"encryption":"on"}`, copyrecord.PropCapacity: "1073741824", "encryption": "on"})
	if _, granted, err := m.Reserve(ctx, id, 2, "n1"); err != nil || !granted {
		t.Fatalf("reserving generation 2: granted %v, %v", granted, err)
	}
	if _, err := m.Promote(ctx, id, 2, 0, true); err != nil {
		t.Fatal(err)
	}
	if v, err := m.Get(ctx, id); err != nil || v.Generation != 2 || !v.Encrypted {
		t.Fatalf("after the promotion: %+v, %v; want an encrypted primary of generation 2", v, err)
	}
}

// TestARetriedRestoreDropsTheSnapshotItsCopyBrought: a raw copy receives
// its source's snapshot along and destroys it; when the create stopped in
// between, its retry destroys it.
func TestARetriedRestoreDropsTheSnapshotItsCopyBrought(t *testing.T) {
	ctx := context.Background()
	m, fake := newKeyManager(t)
	src := create(t, m, CreateRequest{Name: "secret", Parameters: map[string]string{"encryption": "on"}, Passphrase: contract.Passphrase(passphrase)})
	snap := snapshot(t, m, src.ID, "secret-snap")
	req := CreateRequest{Name: "restored", SourceSnapshotID: snap.ID}
	v := create(t, m, req)
	left := v.Dataset + "@" + snap.ID
	if err := fake.Snapshot(ctx, left, nil); err != nil { // as a stop before the destroy leaves it
		t.Fatal(err)
	}
	create(t, m, req)
	if names, _ := fake.SnapshotNames(ctx, v.Dataset); len(names) > 0 {
		t.Fatalf("after the retry %s holds %v, want no snapshot", v.Dataset, names)
	}
	if _, err := m.GetSnapshot(ctx, snap.ID); err != nil {
		t.Fatalf("the source's snapshot: %v", err)
	}
}
