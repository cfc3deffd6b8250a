package operator

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// ResolveVolume finds the volume an operator's argument names: its ID
// (vol-...) or the name it was created with, which is what Nomad sent
// (the name in the volume file; nomad volume status shows the ID as the
// external ID). It says on out which it resolved. A name and an ID that
// name two volumes is refused, listing both.
func ResolveVolume(ctx context.Context, cl *cluster.Cluster, arg string, out io.Writer) (string, error) {
	report, err := Status(ctx, cl)
	if err != nil {
		return "", err
	}
	id, how, err := resolveAmong(report.Copies, arg)
	if err != nil {
		if len(report.Unreachable) > 0 {
			err = fmt.Errorf("%w (%d node(s) did not answer and may hold it: zfs-controller status says which)", err, len(report.Unreachable))
		}
		return "", err
	}
	if how != "" {
		fmt.Fprintf(out, "volume %s: %s\n", id, how)
	}
	return id, nil
}

// resolveAmong resolves arg among the copies that answered. how is empty
// when arg is the ID of a copy that answered.
func resolveAmong(copies []CopyStatus, arg string) (id, how string, err error) {
	byID, byName := "", ""
	var names []string
	for _, c := range copies {
		if c.VolumeID == arg {
			byID = c.VolumeID
		}
		if c.Name == arg {
			byName = c.VolumeID
		}
		names = append(names, c.Name)
	}
	switch {
	case byID != "" && byName != "" && byID != byName:
		return "", "", fmt.Errorf("%w: %q is the ID of volume %s and the name of volume %s: give the ID of the one you mean",
			errdefs.ErrInvalidArgument, arg, byID, byName)
	case byID != "":
		return byID, "", nil
	case byName != "":
		return byName, fmt.Sprintf("the volume named %q", arg), nil
	case contract.IsVolumeID(arg):
		// No copy answered: the command itself says what it finds.
		return arg, "", nil
	}
	slices.Sort(names)
	names = slices.Compact(names)
	known := "no volume answered"
	switch {
	case len(names) > 10:
		known = fmt.Sprintf("zfs-controller status lists the %d volumes", len(names))
	case len(names) > 0:
		known = "the volumes are " + strings.Join(names, ", ")
	}
	return "", "", fmt.Errorf("%w: no volume named %q or with that ID (%s)", errdefs.ErrNotFound, arg, known)
}
