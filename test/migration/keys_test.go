package migration

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/testbed/guestcluster"
	"github.com/zfs-nomad/zfs-nomad/internal/testbed/guesttest"
)

// rootsDir is where zfs-node mounts a new volume for a moment to set its
// root directory (cmd/zfs-node); a file in its place makes that fail.
const rootsDir = "/run/zfs-nomad/roots"

// TestAKeyIsLoadedOnlyWhereTheVolumeIsStaged: whatever stops a create
// half-way, no node holds a volume's key loaded unless the volume is
// staged there, and every create and stage checks its passphrase even
// when the key is loaded:
//   - a create whose root directory cannot be set fails with the key
//     unloaded; its retry with a wrong passphrase is refused, with the
//     right one it answers the volume, the key unloaded;
//   - a create killed between zfs create and the key's unload (zfs-node
//     killed, the key loaded as zfs create left it): zfs-node's start
//     unloads it; the key left loaded again (the kill's state, zfs-node
//     running), a retry with a wrong passphrase is refused and leaves it
//     unloaded, and so does the right one;
//   - left loaded once more, the volume moves to n2: n1 holds a replica
//     with its key unloaded;
//   - staged on n2, a stage at a second path with a wrong passphrase is
//     refused and mounts nothing, while the key stays loaded for the
//     staged path.
func TestAKeyIsLoadedOnlyWhereTheVolumeIsStaged(t *testing.T) {
	// The shipped agent timeout (30 s): an encrypted create derives its
	// key, 6 to 10 s in the emulated guest.
	c := guesttest.StartCluster(t, 3, guestcluster.Options{
		ControllerArgs: []string{"-schedule-every", "0", "-agent-timeout", "30s"},
		NodeArgs:       []string{"-allow-property", "encryption=off:on|off", "-root-uids", "1000"},
	})
	const key = "correct horse battery staple"
	right := map[string]string{contract.SecretEncryptionKey: key}
	wrong := map[string]string{contract.SecretEncryptionKey: "not the passphrase"}
	e := &env{t: t, c: c, ctx: context.Background(), secrets: right}
	n1 := e.node("n1")

	// A failed root setup, between zfs create and the unload.
	guesttest.Exec(t, n1, "mkdir -p "+filepath.Dir(rootsDir)+" && if [ -e "+rootsDir+" ]; then mv "+rootsDir+" "+rootsDir+".saved; fi && touch "+rootsDir)
	owned := map[string]string{"node": "n1", "compression": "off", "encryption": "on", "uid": "1000"}
	_, err := e.createWith("owned", owned, right)
	if err == nil {
		t.Fatal("a create whose root directory cannot be set succeeded")
	}
	guesttest.Exec(t, n1, "rm -f "+rootsDir+" && if [ -e "+rootsDir+".saved ]; then mv "+rootsDir+".saved "+rootsDir+"; fi")
	oid := contract.VolumeIDForName("owned")
	e.wantKeys(oid, "after a create whose root setup failed", map[string]string{"n1": "unavailable"})
	_, err = e.createWith("owned", owned, wrong)
	wantCode(t, err, codes.InvalidArgument, "does not unlock it")
	e.wantKeys(oid, "after its retry with a wrong passphrase", map[string]string{"n1": "unavailable"})
	if _, err := e.createWith("owned", owned, right); err != nil {
		t.Fatalf("the retry with the volume's passphrase: %v", err)
	}
	e.wantKeys(oid, "after its retry", map[string]string{"n1": "unavailable"})

	// A create killed between zfs create and the unload.
	id := e.create("killed", map[string]string{"encryption": "on"})
	ds := n1.RootDataset + "/" + id
	n1.Kill()
	e.loadKeyByHand("n1", ds, key)
	e.returnNodeProcess("n1")
	e.copyOn(id, "n1") // answered once the node serves: its start's sweep ran before
	e.wantKeys(id, "after zfs-node's start", map[string]string{"n1": "unavailable"})
	e.loadKeyByHand("n1", ds, key)
	_, err = e.createWith("killed", map[string]string{"node": "n1", "compression": "off", "encryption": "on"}, wrong)
	wantCode(t, err, codes.InvalidArgument, "does not unlock it")
	e.wantKeys(id, "after a retry with a wrong passphrase", map[string]string{"n1": "unavailable"})
	e.loadKeyByHand("n1", ds, key)
	e.create("killed", map[string]string{"encryption": "on"})
	e.wantKeys(id, "after the retry", map[string]string{"n1": "unavailable"})

	// Left loaded again, then moved: the old primary is a replica, its
	// key unloaded.
	e.loadKeyByHand("n1", ds, key)
	dir := e.mustPublish(id, "n2")
	e.write("n2", dir, "echo moved > f")
	e.wantKeys(id, "after the move to n2", map[string]string{"n1": "unavailable", "n2": "available"})
	if role := e.copyOn(id, "n1").GetRole(); role != contract.RoleReplica {
		t.Fatalf("after the move n1 holds a %s, want a replica", role)
	}

	// Staged on n2, key loaded: a second stage with a wrong passphrase
	// is refused all the same.
	_, err = guesttest.MountWithSecrets(e.ctx, t, e.node("n2"), id, "second-"+id, nil, wrong)
	wantCode(t, err, codes.InvalidArgument, "does not unlock it")
	if out := guesttest.Exec(t, e.node("n2"), "grep -c staging-second-"+id+" /proc/self/mounts || true"); strings.TrimSpace(out) != "0" {
		t.Fatalf("a refused stage left %s mounts at its path", out)
	}
	e.wantKeys(id, "after a refused second stage on n2", map[string]string{"n1": "unavailable", "n2": "available"})
	e.unpublish(id, "n2")
	e.wantKeys(id, "unstaged on n2", map[string]string{"n1": "unavailable", "n2": "unavailable"})
}

// createWith asks the controller to create volume name with exactly
// params and secrets, and returns its answer.
func (e *env) createWith(name string, params, secrets map[string]string) (*csi.CreateVolumeResponse, error) {
	return e.controller().CreateVolume(e.ctx, &csi.CreateVolumeRequest{Name: name, VolumeCapabilities: []*csi.VolumeCapability{writer},
		CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 30}, Parameters: params, Secrets: secrets})
}

// loadKeyByHand loads the key of dataset ds on nodeID with zfs load-key,
// as a create or a stage stopped before its unload leaves it.
func (e *env) loadKeyByHand(nodeID, ds, key string) {
	e.t.Helper()
	guesttest.Exec(e.t, e.node(nodeID), "printf '%s\\n' '"+key+"' | zfs load-key "+ds)
	e.wantKeys(shortID(ds), "loaded by hand", map[string]string{nodeID: "available"})
}

// shortID is the volume ID at the end of a copy's dataset name.
func shortID(ds string) string { return ds[strings.LastIndexByte(ds, '/')+1:] }
