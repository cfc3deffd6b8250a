package migration

import (
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/zfs-nomad/zfs-nomad/internal/testbed/guesttest"
)

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
