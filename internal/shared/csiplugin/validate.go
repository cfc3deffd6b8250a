package csiplugin

import (
	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// supportedAccessModes: a volume is a dataset on one node, so only
// single-node modes make sense.
var supportedAccessModes = map[csi.VolumeCapability_AccessMode_Mode]bool{
	csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER:      true,
	csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY: true,
}

// CheckCapabilities refuses capabilities the driver cannot serve: block
// access (volumes are filesystems), other filesystem types, multi-node modes.
func CheckCapabilities(caps []*csi.VolumeCapability) error {
	if len(caps) == 0 {
		return errdefs.Wrap(errdefs.ErrInvalidArgument, "volume capabilities are required")
	}
	for _, c := range caps {
		if err := CheckCapability(c); err != nil {
			return err
		}
	}
	return nil
}

// CheckCapability refuses one capability the driver cannot serve.
func CheckCapability(c *csi.VolumeCapability) error {
	if c == nil {
		return errdefs.Wrap(errdefs.ErrInvalidArgument, "volume capability is required")
	}
	if c.GetBlock() != nil {
		return errdefs.Wrap(errdefs.ErrInvalidArgument, "block access is not supported: volumes are ZFS filesystems; ask for mount access")
	}
	m := c.GetMount()
	if m == nil {
		return errdefs.Wrap(errdefs.ErrInvalidArgument, "access type is required: ask for mount access")
	}
	if fs := m.GetFsType(); fs != "" && fs != "zfs" {
		return errdefs.Wrap(errdefs.ErrInvalidArgument, "fs_type %q is not supported: volumes are ZFS filesystems (leave it empty or say zfs)", fs)
	}
	mode := c.GetAccessMode().GetMode()
	if !supportedAccessModes[mode] {
		return errdefs.Wrap(errdefs.ErrInvalidArgument, "access mode %s is not supported: a volume lives on one node (use SINGLE_NODE_WRITER or SINGLE_NODE_READER_ONLY)", mode)
	}
	return nil
}

// Required refuses an empty required field.
func Required(field, value string) error {
	if value == "" {
		return errdefs.Wrap(errdefs.ErrInvalidArgument, "%s is required", field)
	}
	return nil
}

// FirstError returns the first non-nil of errs: a request's checks in
// the order the fields appear.
func FirstError(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
