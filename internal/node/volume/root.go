package volume

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/zfs-nomad/zfs-nomad/internal/node/copyrecord"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/config"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// Root is the owner, group and mode a volume's root directory is given at
// creation; -1 leaves one as it is: root, root and 0755 on a new
// filesystem, the source's on a clone. It is part of the data: sends carry
// it, so moves, failovers, replicas and clones keep it.
type Root struct {
	UID, GID int
	// Mode holds the permission bits and setuid, setgid and sticky, as in
	// chmod(2).
	Mode int
}

// RootAsItIs changes nothing.
var RootAsItIs = Root{UID: -1, GID: -1, Mode: -1}

// RootPreparer gives a new volume's root directory its owner and mode.
// Volumes are mountpoint=legacy, so it mounts the dataset in a private
// place for the moment (package mount); it is idempotent. An argument of
// -1 leaves that attribute as it is, as in chown(2).
type RootPreparer interface {
	PrepareRoot(ctx context.Context, dataset string, uid, gid, mode int) error
}

// rootParameters set the root directory, not a ZFS property.
var rootParameters = map[string]bool{contract.ParamUID: true, contract.ParamGID: true, contract.ParamMode: true}

// ResolveRoot reads the root directory parameters within the operator's
// root_directory rules. asked is false when the parameters name none: the
// root stays as ZFS makes it.
func ResolveRoot(cfg *config.Node, params map[string]string) (root Root, asked bool, err error) {
	root = RootAsItIs
	rules := cfg.RootDirectory
	for _, key := range slices.Sorted(maps.Keys(params)) {
		if !rootParameters[key] {
			continue
		}
		asked = true
		value := params[key]
		switch key {
		case contract.ParamUID, contract.ParamGID:
			id, err := config.ParseID(value)
			if err != nil {
				return Root{}, false, fmt.Errorf("%w: parameter %q: %v", errdefs.ErrInvalidArgument, key, err)
			}
			allowed, list, setting := rules.AllowsUID(id), rules.UIDs, "uids"
			if key == contract.ParamGID {
				allowed, list, setting = rules.AllowsGID(id), rules.GIDs, "gids"
			}
			if !allowed {
				return Root{}, false, fmt.Errorf("%w: parameter %q=%q is not allowed: the operator allows %s (root_directory.%s in zfs-node's config)",
					errdefs.ErrInvalidArgument, key, value, allowedIDs(list), setting)
			}
			if key == contract.ParamUID {
				root.UID = int(id)
			} else {
				root.GID = int(id)
			}
		case contract.ParamMode:
			mode, err := config.ParseMode(value)
			if err != nil {
				return Root{}, false, fmt.Errorf("%w: parameter %q: %v", errdefs.ErrInvalidArgument, key, err)
			}
			mask, _ := rules.Mask() // checked when the config was loaded
			if extra := mode &^ mask; extra != 0 {
				return Root{}, false, fmt.Errorf("%w: parameter %q=%q sets bits %04o that the operator does not allow (root_directory.mode_mask %04o)",
					errdefs.ErrInvalidArgument, key, value, extra, mask)
			}
			root.Mode = int(mode)
		}
	}
	return root, asked, nil
}

// String says what r sets, as the log and errors put it.
func (r Root) String() string {
	var parts []string
	if r.UID >= 0 {
		parts = append(parts, fmt.Sprintf("uid %d", r.UID))
	}
	if r.GID >= 0 {
		parts = append(parts, fmt.Sprintf("gid %d", r.GID))
	}
	if r.Mode >= 0 {
		parts = append(parts, fmt.Sprintf("mode %04o", r.Mode))
	}
	return strings.Join(parts, ", ")
}

func allowedIDs(ranges []string) string {
	if len(ranges) == 0 {
		return "none"
	}
	return strings.Join(ranges, ", ")
}

// prepareRoot gives a volume created with PropRootPending its root's owner
// and mode, then clears the mark: a create interrupted between the two
// leaves the mark, and its retry (which finds the volume) does it again.
func (m *Manager) prepareRoot(ctx context.Context, dataset string, root Root) error {
	if m.host.Roots == nil {
		return errors.New("this node cannot set a volume's root directory owner (no RootPreparer)")
	}
	if err := m.host.Roots.PrepareRoot(ctx, dataset, root.UID, root.GID, root.Mode); err != nil {
		return fmt.Errorf("setting the root directory of %s to %s: %w; retry the create", dataset, root, err)
	}
	return m.zfs.ClearUserProperty(ctx, dataset, copyrecord.PropRootPending)
}

// finishRoot prepares the root of a new volume made without a key of
// its own (a raw copy), or of one whose create stopped half-way, loading
// an encrypted volume's key for the moment it takes; OpenKey checks the
// passphrase whether or not the key is loaded. The caller unloads the
// key, whatever happens (closeCreated).
func (m *Manager) finishRoot(ctx context.Context, v Volume, root Root, given contract.Passphrase) error {
	if _, err := m.OpenKey(ctx, v, given); err != nil {
		return err
	}
	return m.prepareRoot(ctx, v.Dataset, root)
}
