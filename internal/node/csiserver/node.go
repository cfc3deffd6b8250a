// Package csiserver is the CSI node service, served by zfs-node: it stages
// and publishes the volumes this node holds (package volume) into the
// paths the CO names (package mount).
package csiserver

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/hashicorp/go-hclog"

	"github.com/zfs-nomad/zfs-nomad/internal/node/mount"
	"github.com/zfs-nomad/zfs-nomad/internal/node/volume"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/config"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/csiplugin"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/keylock"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/pathcheck"
)

// Mounter is what the node service needs of the kernel's mount table;
// mount.System is the real one.
type Mounter interface {
	Lookup(path string) (mount.Entry, bool, error)
	MountZFS(dataset, target string, flags []string) error
	Bind(source, target string, flags []string) error
	Unmount(target string) error
	Statfs(path string) (mount.Stats, error)
}

// Node is the CSI Node service of zfs-node.
//
// A volume is staged by mounting its dataset at the staging path and
// published by bind-mounting the staging path at the target. The dataset is
// derived from the volume ID alone: the volume context is never trusted,
// since a job submitter can forge it with `nomad volume register`.
type Node struct {
	csi.UnimplementedNodeServer
	// PromotionWait bounds how long a stage published ahead of a move's
	// end waits for the promotion, within the call's deadline (zero:
	// two minutes); the fault simulation, on its own clock, waits not.
	PromotionWait time.Duration

	volumes Volumes
	mounter Mounter
	cfg     config.Node
	log     hclog.Logger
	locks   keylock.Locks
}

// Volumes are the node's volumes as the CSI node service stages and
// publishes them (volume.Manager).
type Volumes interface {
	Get(ctx context.Context, id string) (volume.Volume, error)
	Copy(ctx context.Context, id string) (volume.Copy, error)
	// Stageable checks that this node's copy of volume id may be staged
	// at generation, and returns it with its lock held until unlock.
	Stageable(ctx context.Context, id string, generation uint64) (v volume.Volume, unlock func(), err error)
	// AwaitPromotion tells that a stage waits for the copy's promotion
	// past generation after, until done; promoted is closed when this
	// node promotes the copy.
	AwaitPromotion(id string, after uint64) (promoted <-chan struct{}, done func())
	OpenKey(ctx context.Context, v volume.Volume, given contract.Passphrase) (opened bool, err error)
	CloseKey(ctx context.Context, id string) error
}

// New returns the Node service.
func New(volumes Volumes, mounter Mounter, cfg config.Node, log hclog.Logger) *Node {
	return &Node{volumes: volumes, mounter: mounter, cfg: cfg, log: log}
}

func (n *Node) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	return &csi.NodeGetInfoResponse{
		NodeId:             n.cfg.NodeID,
		MaxVolumesPerNode:  n.cfg.MaxVolumes,
		AccessibleTopology: &csi.Topology{Segments: n.cfg.Segments()},
	}, nil
}

func (n *Node) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	var caps []*csi.NodeServiceCapability
	for _, t := range []csi.NodeServiceCapability_RPC_Type{
		csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME,
		csi.NodeServiceCapability_RPC_GET_VOLUME_STATS,
		csi.NodeServiceCapability_RPC_EXPAND_VOLUME,
	} {
		caps = append(caps, &csi.NodeServiceCapability{
			Type: &csi.NodeServiceCapability_Rpc{Rpc: &csi.NodeServiceCapability_RPC{Type: t}},
		})
	}
	return &csi.NodeGetCapabilitiesResponse{Capabilities: caps}, nil
}

// lockVolume gives Aborted to a call that overlaps another on the volume.
func (n *Node) lockVolume(id string) (func(), error) {
	unlock, ok := n.locks.TryLock(id)
	if !ok {
		return nil, errdefs.Wrap(errdefs.ErrAborted, "an operation on volume %s is already in progress on this node; retry later", id)
	}
	return unlock, nil
}

// lockStageable checks that the volume's copy here may be staged at the
// generation the controller published, and returns it locked: the call's
// lock on the volume (Aborted if another call holds it) and the copy's
// lock, held until the caller's mount is done, so that no fence or
// demotion overtakes it.
func (n *Node) lockStageable(ctx context.Context, id string, publishContext map[string]string) (volume.Volume, func(), error) {
	generation, err := n.publishedGeneration(ctx, id, publishContext)
	if err != nil {
		return volume.Volume{}, nil, err
	}
	unlockCall, err := n.lockVolume(id)
	if err != nil {
		return volume.Volume{}, nil, err
	}
	v, unlockCopy, err := n.volumes.Stageable(ctx, id, generation)
	if err != nil {
		unlockCall()
		return volume.Volume{}, nil, err
	}
	return v, func() { unlockCopy(); unlockCall() }, nil
}

// publishedGeneration is the generation the node may stage: the one the
// publish context names (0: none named, not checked) or, for a publish
// granted ahead of the end of the volume's move here, the generation of
// this node's copy once the move has promoted it.
func (n *Node) publishedGeneration(ctx context.Context, id string, pc map[string]string) (uint64, error) {
	generation, err := contextGeneration(pc, contract.PublishContextGeneration)
	if err != nil {
		return 0, err
	}
	after, err := contextGeneration(pc, contract.PublishContextAfterGeneration)
	if err != nil || after == 0 {
		return generation, err
	}
	if generation != 0 {
		return 0, errdefs.Wrap(errdefs.ErrInvalidArgument, "publish context names both %s and %s; a publish grants one", contract.PublishContextGeneration, contract.PublishContextAfterGeneration)
	}
	return n.promotedAfter(ctx, id, after)
}

// promotedAfter waits until this node's copy of volume id is the primary
// of a generation newer than after, the generation of the move's source,
// and returns it. A node stages only a primary, and a move promotes its
// target only after fencing its source and reserving the new generation
// from a majority, so the copy it returns is the volume's one writable
// copy (Stageable checks the rest). It holds no lock while it waits: the
// promotion needs the copy's. It gives up before the call's deadline
// with Unavailable, which Nomad retries.
func (n *Node) promotedAfter(ctx context.Context, id string, after uint64) (uint64, error) {
	wait := cmp.Or(n.PromotionWait, maxPromotionWait)
	if d, ok := ctx.Deadline(); ok {
		wait = min(wait, time.Until(d)-promotionWaitMargin)
	}
	giveUp := time.Now().Add(wait)
	var promoted <-chan struct{}
	for first := true; ; first = false {
		// Get reads the one dataset (Copy would list its snapshots and
		// the mount table too, every half second); it answers only for a
		// primary, NotFound before the copy arrives, Unavailable while
		// the receive that creates it runs (ZFS cannot open it then) and
		// FailedPrecondition for a replica.
		v, err := n.volumes.Get(ctx, id)
		switch {
		case err == nil && v.Generation > after:
			if !first {
				n.log.Info("copy promoted: staging the volume published ahead of its move's end", "volume_id", id, "generation", v.Generation)
			}
			return v.Generation, nil
		case err != nil && !errors.Is(err, errdefs.ErrNotFound) && !errors.Is(err, errdefs.ErrUnavailable) && !errors.Is(err, errdefs.ErrFailedPrecondition):
			return 0, err
		}
		if first {
			n.log.Info("volume published ahead of its move's end: staging waits for this node's copy to be promoted", "volume_id", id, "after_generation", after)
			// Tells the controller the move is wanted here, should the
			// instance that runs it die, and wakes this wait when the
			// promotion comes.
			var done func()
			promoted, done = n.volumes.AwaitPromotion(id, after)
			defer done()
		}
		if !time.Now().Before(giveUp) {
			return 0, errdefs.Wrap(errdefs.ErrUnavailable, "volume %s was published on node %s ahead of the end of its move here, and the copy here is not promoted yet (%s): the move still runs, or failed (zfs-controller status shows it); retry",
				id, n.cfg.NodeID, n.describeCopy(ctx, id))
		}
		t := time.NewTimer(promotionPoll)
		select {
		case <-ctx.Done():
			t.Stop()
			return 0, errdefs.Wrap(errdefs.ErrUnavailable, "volume %s: waiting for the copy on node %s to be promoted by its move: %v; retry", id, n.cfg.NodeID, ctx.Err())
		case <-t.C:
		case <-promoted:
			t.Stop()
			promoted = nil // woken once; polls on should the copy not show it
		}
	}
}

// How long and how often a stage waits for a move's promotion: within
// the CO's deadline, less a margin for the answer; two minutes where the
// CO sets none (Nomad gives a stage two minutes a try).
const (
	maxPromotionWait    = 2 * time.Minute
	promotionWaitMargin = 2 * time.Second
	promotionPoll       = 500 * time.Millisecond
)

// describeCopy says what this node holds of volume id, for an error.
func (n *Node) describeCopy(ctx context.Context, id string) string {
	c, err := n.volumes.Copy(ctx, id)
	switch {
	case err != nil:
		return err.Error()
	case !c.Exists:
		return "none yet"
	}
	return fmt.Sprintf("%s of generation %d", c.Role, c.Generation)
}

// checkPaths refuses, as InvalidArgument and before anything is mounted,
// a staging or target path that is not absolute and clean, not below the
// operator's base directories, or reached through a symbolic link.
func (n *Node) checkPaths(paths ...string) error {
	for _, p := range paths {
		if err := pathcheck.Check(p, n.cfg.BaseDirs()); err != nil {
			return errdefs.Wrap(errdefs.ErrInvalidArgument, "%v", err)
		}
	}
	return nil
}

// mountFlags checks a claim's mount flags against the operator's allowlist.
func (n *Node) mountFlags(c *csi.VolumeCapability) ([]string, error) {
	flags := c.GetMount().GetMountFlags()
	for _, f := range flags {
		if !slices.Contains(n.cfg.MountFlags, f) {
			return nil, errdefs.Wrap(errdefs.ErrInvalidArgument, "mount flag %q is not allowed on this node (allowed: %v)", f, n.cfg.MountFlags)
		}
	}
	return flags, nil
}

func (n *Node) NodeStageVolume(ctx context.Context, req *csi.NodeStageVolumeRequest) (*csi.NodeStageVolumeResponse, error) {
	if err := n.stage(ctx, req); err != nil {
		return nil, err
	}
	return &csi.NodeStageVolumeResponse{}, nil
}

func (n *Node) stage(ctx context.Context, req *csi.NodeStageVolumeRequest) error {
	id, staging := req.GetVolumeId(), req.GetStagingTargetPath()
	if err := csiplugin.FirstError(csiplugin.Required("volume_id", id), csiplugin.Required("staging_target_path", staging), csiplugin.CheckCapability(req.GetVolumeCapability())); err != nil {
		return err
	}
	if err := n.checkPaths(staging); err != nil {
		return err
	}
	flags, err := n.mountFlags(req.GetVolumeCapability())
	if err != nil {
		return err
	}
	v, unlock, err := n.lockStageable(ctx, id, req.GetPublishContext())
	if err != nil {
		return err
	}
	defer unlock()
	// The node holds the data: it is where an owner secret is decisive
	// (contract.CheckOwner).
	if err := contract.CheckOwner("volume "+id, v.Parameters, req.GetSecrets()); err != nil {
		return err
	}
	// An encrypted volume's key is checked against the stage's
	// passphrase first, loaded or not (a stage repeated at the same path,
	// or at a second one, included), then loaded here and unloaded at
	// unstage (volume.Manager.OpenKey): a wrong or missing key mounts
	// nothing. A key this call loaded is unloaded again if it mounts
	// nothing.
	opened, err := n.volumes.OpenKey(ctx, v, contract.PassphraseFrom(req.GetSecrets()))
	if err != nil {
		return err
	}
	if err := n.mountStaging(v, staging, flags); err != nil {
		if opened {
			if cerr := n.volumes.CloseKey(ctx, id); cerr != nil {
				n.log.Warn("could not unload the key of a volume whose stage failed", "volume_id", id, "error", cerr)
			}
		}
		return err
	}
	return nil
}

// mountStaging mounts volume v's dataset at staging, unless it is
// mounted there already. The staging mount stays writable: read-only is
// applied per publish.
func (n *Node) mountStaging(v volume.Volume, staging string, flags []string) error {
	entry, mounted, err := n.mounter.Lookup(staging)
	if err != nil {
		return err
	}
	if mounted {
		if entry.FSType == "zfs" && entry.Source == v.Dataset {
			return nil // staged already
		}
		return errdefs.Wrap(errdefs.ErrAlreadyExists, "staging path %s already has %s (%s) mounted, not volume %s", staging, entry.Source, entry.FSType, v.ID)
	}
	if err := n.mounter.MountZFS(v.Dataset, staging, without(flags, "ro")); err != nil {
		return err
	}
	n.log.Info("volume staged", "volume_id", v.ID, "dataset", v.Dataset, "path", staging, "encrypted", v.Encrypted)
	return nil
}

// contextGeneration reads a generation from the publish context (0: the
// key is absent).
func contextGeneration(pc map[string]string, key string) (uint64, error) {
	v, ok := pc[key]
	if !ok {
		return 0, nil
	}
	gen, err := strconv.ParseUint(v, 10, 64)
	if err != nil || gen == 0 {
		return 0, errdefs.Wrap(errdefs.ErrInvalidArgument, "publish context %s=%q is not a generation", key, v)
	}
	return gen, nil
}

func (n *Node) NodeUnstageVolume(ctx context.Context, req *csi.NodeUnstageVolumeRequest) (*csi.NodeUnstageVolumeResponse, error) {
	if err := n.unmount(ctx, req.GetVolumeId(), req.GetStagingTargetPath(), false); err != nil {
		return nil, err
	}
	return &csi.NodeUnstageVolumeResponse{}, nil
}

// unmount is what unstaging and unpublishing share: it unmounts path, the
// volume's staging path or (target set) a target path, under the volume's
// lock. A target path is removed too: the plugin created it in
// NodePublishVolume, and the spec has it remove it again. Unstaging
// unloads an encrypted volume's key: it is loaded only while staged.
func (n *Node) unmount(ctx context.Context, id, path string, target bool) error {
	field, done := "staging_target_path", "volume unstaged"
	if target {
		field, done = "target_path", "volume unpublished"
	}
	if err := csiplugin.FirstError(csiplugin.Required("volume_id", id), csiplugin.Required(field, path)); err != nil {
		return err
	}
	if err := n.checkPaths(path); err != nil {
		return err
	}
	unlock, err := n.lockVolume(id)
	if err != nil {
		return err
	}
	defer unlock()
	if err := n.mounter.Unmount(path); err != nil {
		return err
	}
	if target {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			n.log.Warn("could not remove the unpublished target path", "volume_id", id, "path", path, "error", err)
		}
	} else if contract.IsVolumeID(id) {
		if err := n.volumes.CloseKey(ctx, id); err != nil {
			return err
		}
	}
	n.log.Info(done, "volume_id", id, "path", path)
	return nil
}

func (n *Node) NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	if err := n.publish(ctx, req); err != nil {
		return nil, err
	}
	return &csi.NodePublishVolumeResponse{}, nil
}

func (n *Node) publish(ctx context.Context, req *csi.NodePublishVolumeRequest) error {
	id, staging, target := req.GetVolumeId(), req.GetStagingTargetPath(), req.GetTargetPath()
	if err := csiplugin.FirstError(csiplugin.Required("volume_id", id), csiplugin.Required("staging_target_path", staging), csiplugin.Required("target_path", target), csiplugin.CheckCapability(req.GetVolumeCapability())); err != nil {
		return err
	}
	if err := n.checkPaths(staging, target); err != nil {
		return err
	}
	flags, err := n.mountFlags(req.GetVolumeCapability())
	if err != nil {
		return err
	}
	readOnly := req.GetReadonly() || req.GetVolumeCapability().GetAccessMode().GetMode() == csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY
	if readOnly && !slices.Contains(flags, "ro") {
		flags = append(flags, "ro")
	}
	// The generation is checked again here, not only at staging: a copy
	// staged before a newer generation took over elsewhere must not be
	// handed to another allocation.
	v, unlock, err := n.lockStageable(ctx, id, req.GetPublishContext())
	if err != nil {
		return err
	}
	defer unlock()
	// The node holds the data: it is where an owner secret is decisive
	// (contract.CheckOwner).
	if err := contract.CheckOwner("volume "+id, v.Parameters, req.GetSecrets()); err != nil {
		return err
	}
	if entry, mounted, err := n.mounter.Lookup(staging); err != nil {
		return err
	} else if !mounted || entry.Source != v.Dataset {
		return errdefs.Wrap(errdefs.ErrFailedPrecondition, "volume %s is not staged at %s; call NodeStageVolume first", id, staging)
	}
	entry, mounted, err := n.mounter.Lookup(target)
	if err != nil {
		return err
	}
	if mounted {
		if entry.Source == v.Dataset && entry.HasOption("ro") == readOnly {
			return nil // published already
		}
		return errdefs.Wrap(errdefs.ErrAlreadyExists, "target %s already has %s mounted (options %s), incompatible with this request", target, entry.Source, entry.Options)
	}
	if err := os.MkdirAll(target, 0o750); err != nil {
		return errdefs.Wrap(errdefs.ErrInvalidArgument, "creating target path %s: %v", target, err)
	}
	if err := n.mounter.Bind(staging, target, flags); err != nil {
		return err
	}
	n.log.Info("volume published", "volume_id", id, "path", target, "read_only", readOnly)
	return nil
}

func (n *Node) NodeUnpublishVolume(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	if err := n.unmount(ctx, req.GetVolumeId(), req.GetTargetPath(), true); err != nil {
		return nil, err
	}
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

func (n *Node) NodeGetVolumeStats(ctx context.Context, req *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error) {
	id, path := req.GetVolumeId(), req.GetVolumePath()
	if err := csiplugin.FirstError(csiplugin.Required("volume_id", id), csiplugin.Required("volume_path", path)); err != nil {
		return nil, err
	}
	if err := n.checkMountedAt(ctx, id, path); err != nil {
		return nil, err
	}
	st, err := n.mounter.Statfs(path)
	if err != nil {
		return nil, err
	}
	return &csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{
		{Unit: csi.VolumeUsage_BYTES, Total: st.TotalBytes, Available: st.AvailableBytes, Used: st.UsedBytes},
		{Unit: csi.VolumeUsage_INODES, Total: st.TotalInodes, Available: st.FreeInodes, Used: st.UsedInodes},
	}}, nil
}

// checkMountedAt fails with NotFound unless volume id exists and is mounted
// at path.
func (n *Node) checkMountedAt(ctx context.Context, id, path string) error {
	v, err := n.volumes.Get(ctx, id)
	if err != nil {
		return err
	}
	entry, mounted, err := n.mounter.Lookup(path)
	if err != nil {
		return err
	}
	if !mounted || entry.Source != v.Dataset {
		return errdefs.Wrap(errdefs.ErrNotFound, "volume %s is not mounted at %s", id, path)
	}
	return nil
}

// NodeExpandVolume has nothing to do: the quota the controller raised is in
// force at once. It reports the capacity.
func (n *Node) NodeExpandVolume(ctx context.Context, req *csi.NodeExpandVolumeRequest) (*csi.NodeExpandVolumeResponse, error) {
	id, path := req.GetVolumeId(), req.GetVolumePath()
	if err := csiplugin.FirstError(csiplugin.Required("volume_id", id), csiplugin.Required("volume_path", path)); err != nil {
		return nil, err
	}
	if vc := req.GetVolumeCapability(); vc != nil {
		if err := csiplugin.CheckCapability(vc); err != nil {
			return nil, err
		}
	}
	if err := n.checkMountedAt(ctx, id, path); err != nil {
		return nil, err
	}
	v, err := n.volumes.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	return &csi.NodeExpandVolumeResponse{CapacityBytes: int64(v.Capacity)}, nil
}

func without(list []string, drop string) []string {
	var out []string
	for _, x := range list {
		if x != drop {
			out = append(out, x)
		}
	}
	return out
}
