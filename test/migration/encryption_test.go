package migration

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/testbed/guestcluster"
	"github.com/zfs-nomad/zfs-nomad/internal/testbed/guesttest"
)

// TestEncryptedVolumesOpenOnlyWhereStaged: a volume created with
// encryption=on and its passphrase in the claim's secrets is encrypted on
// every node that holds it, and its key is loaded only on the node that
// has it staged, for as long as it is staged: not after the create, not
// on replicas, not after an unstage. A stage with a wrong key (from the
// secrets, or from the operator's key file when the secrets carry none)
// is InvalidArgument and mounts nothing. After a move, a restore from a
// snapshot on another node and a manual failover the stage loads the key
// and the workload reads its files. A volume whose claims carry no key
// opens with the key file's. Whatever stops a create half-way leaves no
// key loaded: a create killed before the key's unload has it unloaded by
// zfs-node's start, and its retry checks the passphrase (a create whose
// root directory cannot be set, and its retries, are
// TestARetriedCreateChecksTheKeyAndLeavesItUnloaded's, over the fake: the
// ZFS steps are the same); a key left loaded on a source goes with its
// demotion after a move; a stage checks the passphrase even where the key
// is loaded.
//
// It runs where the kernel module is OpenZFS 2.2 or later (make
// test-trixie): on 2.1 a mount of an encrypted volume may oops the
// module and hang the guest's ZFS (docs/security.md), which this test's
// stages after moves met once in make test; the docs keep encrypted
// volumes off 2.1.
func TestEncryptedVolumesOpenOnlyWhereStaged(t *testing.T) {
	t.Parallel()
	if guesttest.EncryptedMountDefect(t) {
		t.Skip("OpenZFS 2.1's kernel module may oops mounting an encrypted volume (docs/security.md): make test-trixie runs this test on 2.3")
	}
	// The operator's key file, the same on every node (they share the
	// guest's file system): for claims whose secrets carry no key.
	keyFile := filepath.Join(t.TempDir(), "volume-key")
	if err := os.WriteFile(keyFile, []byte("the operator's passphrase\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The shipped agent timeout (30 s), not the simulation's 10 s: an
	// encrypted create derives its key. The fewest key derivation
	// iterations OpenZFS takes, not its default 350,000: the emulated
	// guest has no SHA instructions and takes 6 to 10 s a derivation at
	// the default, and this test derives a key about twenty times; how
	// many iterations changes nothing else the driver does.
	const iterations = "100000"
	c := guesttest.StartCluster(t, 3, guestcluster.Options{
		ControllerArgs: explicitPushes("-agent-timeout", "30s"),
		NodeArgs: []string{"-allow-property", "encryption=off:on|off|aes-256-gcm", "-encryption-key-file", keyFile,
			"-encryption-pbkdf2-iterations", iterations},
	})
	const key = "correct horse battery staple"
	e := &env{t: t, c: c, ctx: context.Background(), secrets: map[string]string{contract.SecretEncryptionKey: key}}

	id := e.create("secret", map[string]string{"encryption": "aes-256-gcm"})
	e.wantKeys(id, "created", map[string]string{"n1": "unavailable"})

	// A create killed between zfs create and the key's unload (zfs-node
	// killed, the key loaded as zfs create left it): zfs-node's start
	// unloads it before it serves. Left loaded again (the kill's state,
	// zfs-node running), the create's retry checks the passphrase whether
	// the key is loaded or not: a wrong one is refused, and either way the
	// key is left unloaded.
	n1 := e.node("n1")
	ds := n1.RootDataset + "/" + id
	n1.Kill()
	e.loadKeyByHand("n1", ds, key)
	e.returnNodeProcess("n1")
	e.copyOn(id, "n1") // answered once the node serves: its start's sweep ran before
	e.wantKeys(id, "after zfs-node's start", map[string]string{"n1": "unavailable"})
	created := map[string]string{"node": "n1", "compression": "off", "encryption": "aes-256-gcm"}
	e.loadKeyByHand("n1", ds, key)
	_, err := e.createWith("secret", created, map[string]string{contract.SecretEncryptionKey: "not the passphrase"})
	wantCode(t, err, codes.InvalidArgument, "does not unlock it")
	e.wantKeys(id, "after a create's retry with a wrong passphrase", map[string]string{"n1": "unavailable"})
	e.loadKeyByHand("n1", ds, key)
	if _, err := e.createWith("secret", created, e.secrets); err != nil {
		t.Fatalf("the create's retry with the volume's passphrase: %v", err)
	}
	e.wantKeys(id, "after the create's retry", map[string]string{"n1": "unavailable"})

	// With a wrong key, from the secrets or (none there) the key file:
	// refused, nothing mounted.
	for _, tc := range []struct {
		secrets map[string]string
		from    string
	}{
		{nil, "the passphrase from the key file " + keyFile + " does not unlock it"},
		{map[string]string{contract.SecretEncryptionKey: "not the passphrase"}, "the passphrase from the secret encryption_key does not unlock it"},
	} {
		e.secrets = tc.secrets
		_, err := e.publish(id, "n1")
		wantCode(t, err, codes.InvalidArgument, tc.from)
		e.wantKeys(id, "after a refused stage", map[string]string{"n1": "unavailable"})
		if out := guesttest.Exec(t, e.node("n1"), "grep -c "+e.node("n1").RootDataset+"/"+id+" /proc/self/mounts || true"); strings.TrimSpace(out) != "0" {
			t.Fatalf("a refused stage left %s mounts of the volume", out)
		}
	}
	e.secrets = map[string]string{contract.SecretEncryptionKey: key}

	dir := e.mustPublish(id, "n1")
	e.write("n1", dir, "echo first > f && head -c 4194304 /dev/urandom > blob")
	e.wantKeys(id, "staged on n1", map[string]string{"n1": "available"})
	want := e.checksums("n1", dir)
	e.unpublish(id, "n1")
	e.wantKeys(id, "unstaged", map[string]string{"n1": "unavailable"})

	// A move: n2 receives raw and loads the key only when it stages; the
	// key left loaded on n1 (a crash's state) goes with n1's demotion.
	e.loadKeyByHand("n1", ds, key)
	dir = e.mustPublish(id, "n2")
	if got := e.checksums("n2", dir); got != want {
		t.Fatalf("after the move n2 holds:\n%s\nwant:\n%s", got, want)
	}
	e.wantKeys(id, "staged on n2 after the move", map[string]string{"n1": "unavailable", "n2": "available"})
	if role := e.copyOn(id, "n1").GetRole(); role != contract.RoleReplica {
		t.Fatalf("after the move n1 holds a %s, want a replica", role)
	}
	// The operator's iterations, set at the create, came with the raw send.
	for _, n := range []string{"n1", "n2"} {
		if got := strings.TrimSpace(guesttest.Exec(t, e.node(n), "zfs get -H -o value pbkdf2iters "+e.node(n).RootDataset+"/"+id)); got != iterations {
			t.Fatalf("the copy on %s derives its key with %s iterations, want the node's %s", n, got, iterations)
		}
	}
	// Staged on n2, its key loaded: a stage at a second path with a wrong
	// passphrase is refused all the same and mounts nothing.
	_, err = guesttest.MountWithSecrets(e.ctx, t, e.node("n2"), id, "second-"+id, nil, map[string]string{contract.SecretEncryptionKey: "not the passphrase"})
	wantCode(t, err, codes.InvalidArgument, "does not unlock it")
	if out := guesttest.Exec(t, e.node("n2"), "grep -c staging-second-"+id+" /proc/self/mounts || true"); strings.TrimSpace(out) != "0" {
		t.Fatalf("a refused stage left %s mounts at its path", out)
	}
	e.wantKeys(id, "after a refused second stage on n2", map[string]string{"n1": "unavailable", "n2": "available"})
	e.write("n2", dir, "echo second >> f")
	want = e.checksums("n2", dir)
	snap, err := e.controller().CreateSnapshot(e.ctx, &csi.CreateSnapshotRequest{SourceVolumeId: id, Name: "secret-snap"})
	if err != nil {
		t.Fatal(err)
	}
	e.unpublish(id, "n2")
	e.wantKeys(id, "unstaged on n2", map[string]string{"n1": "unavailable", "n2": "unavailable"})

	// A restore, staged on another node than the snapshot's: the same key.
	// Made on n2, which holds the snapshot: a raw copy, its own
	// encryption root (a clone would need the source volume's key).
	rid := e.restore("secret-restored", snap.GetSnapshot().GetSnapshotId(), nil)
	e.wantKeys(rid, "restored on n2", map[string]string{"n2": "unavailable"})
	rdir := e.mustPublish(rid, "n3")
	if got := e.checksums("n3", rdir); got != want {
		t.Fatalf("the restored volume holds:\n%s\nwant:\n%s", got, want)
	}
	e.wantKeys(rid, "restore staged on n3", map[string]string{"n3": "available"})
	e.unpublish(rid, "n3")
	e.wantKeys(rid, "restore unstaged", map[string]string{"n3": "unavailable"})
	e.deleteVolume(rid)

	// A manual failover: n2 (the primary) is lost, n1's replica promoted.
	e.replicate(id, "n2", "n1")
	e.wantKeys(id, "replicated to n1", map[string]string{"n1": "unavailable", "n2": "unavailable"})
	e.loseNode("n2")
	e.promote(id, "n1")
	e.secrets = map[string]string{contract.SecretEncryptionKey: "not the passphrase"}
	_, err = e.publish(id, "n1")
	wantCode(t, err, codes.InvalidArgument, "does not unlock it")
	e.secrets = map[string]string{contract.SecretEncryptionKey: key}
	dir = e.mustPublish(id, "n1")
	if got := e.checksums("n1", dir); got != want {
		t.Fatalf("after the failover n1 holds:\n%s\nwant:\n%s", got, want)
	}
	e.wantKeys(id, "staged on n1 after the failover", map[string]string{"n1": "available"})
	e.unpublish(id, "n1")

	// A volume whose claims carry no key: the operator's key file opens
	// it, on its first node and after a move.
	e.secrets = nil
	kid := e.create("keyfile", map[string]string{"encryption": "on"})
	e.write("n1", e.mustPublish(kid, "n1"), "echo from the key file > f")
	e.unpublish(kid, "n1")
	kdir := e.mustPublish(kid, "n3")
	if got := guesttest.Exec(t, e.node("n3"), "cat "+kdir+"/f"); strings.TrimSpace(got) != "from the key file" {
		t.Fatalf("after the move n3 reads %q", got)
	}
	e.wantKeys(kid, "staged on n3 with the key file's key", map[string]string{"n1": "unavailable", "n3": "available"})
}

// wantKeys checks the encryption and key status of volume id's copy on
// each node named: every copy is encrypted, and its key status is as
// given ("available" only where the volume is staged).
func (e *env) wantKeys(id, when string, want map[string]string) {
	e.t.Helper()
	for nodeID, status := range want {
		ds := e.node(nodeID).RootDataset + "/" + id
		got := strings.Fields(guesttest.Exec(e.t, e.node(nodeID), "zfs get -H -p -o value encryption,keystatus,encryptionroot "+ds))
		if len(got) != 3 || got[0] == "off" || got[1] != status || got[2] != ds {
			e.t.Errorf("%s: %s on %s has encryption, keystatus, encryptionroot %q; want encrypted, %s, itself", when, id, nodeID, got, status)
		}
	}
}
