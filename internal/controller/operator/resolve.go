package operator

import (
	"cmp"
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
// external ID). It says on out which it resolved. A name never resolves
// to a volume silently: one that copies of two volume IDs carry, or whose
// copies carry an ID other than the name's (a volume's ID derives from
// its name: contract.VolumeIDForName), is refused, listing the IDs, as is
// a name and an ID that name two volumes. A copy's name is a label a
// peer's stream set (a full stream labels a replica with the name its
// header gives), so a command acting on a name's last matching copy
// could act on another volume.
func ResolveVolume(ctx context.Context, cl *cluster.Cluster, arg string, out io.Writer) (string, error) {
	report, err := Status(ctx, cl)
	if err != nil {
		return "", err
	}
	id, how, err := resolveAmong(report.Copies, arg)
	if err != nil {
		if len(report.Unreachable) > 0 {
			err = fmt.Errorf("%w (%d node(s) did not answer and may hold it: %s)", err, len(report.Unreachable), whyUnanswered(report.Unreachable))
		}
		return "", err
	}
	if how != "" {
		fmt.Fprintf(out, "volume %s: %s\n", id, how)
	}
	return id, nil
}

// whyUnanswered says why each node did not answer, the first three of them
// (zfs-controller status lists them all).
func whyUnanswered(nodes []Unreachable) string {
	const shown = 3
	var out []string
	for _, u := range nodes[:min(len(nodes), shown)] {
		out = append(out, u.Node+": "+u.Error)
	}
	if len(nodes) > shown {
		out = append(out, fmt.Sprintf("and %d more (zfs-controller status lists them)", len(nodes)-shown))
	}
	return strings.Join(out, "; ")
}

// resolveAmong resolves arg among the copies that answered. how is empty
// when arg is the ID of a copy that answered whose labels agree with it.
func resolveAmong(copies []CopyStatus, arg string) (id, how string, err error) {
	byID := ""
	var named, names, mislabelled []string // named: the IDs of the copies named arg
	for _, c := range copies {
		if c.VolumeID == arg {
			byID = c.VolumeID
			if c.Name != "" && c.Name != "-" && contract.VolumeIDForName(c.Name) != c.VolumeID {
				mislabelled = append(mislabelled, fmt.Sprintf("%s's copy is labelled %q", cmp.Or(c.Node, "a node"), c.Name))
			}
		}
		if c.Name == arg {
			named = append(named, c.VolumeID)
		}
		names = append(names, c.Name)
	}
	slices.Sort(named)
	named = slices.Compact(named)
	switch {
	case byID != "" && len(named) > 0 && !slices.Equal(named, []string{byID}):
		return "", "", fmt.Errorf("%w: %q is the ID of volume %s and the name of volume %s: give the ID of the one you mean",
			errdefs.ErrInvalidArgument, arg, byID, strings.Join(slices.DeleteFunc(named, func(n string) bool { return n == byID }), " and "))
	case byID != "" && len(mislabelled) > 0:
		// The ID decides; the labels are reported, not followed.
		slices.Sort(mislabelled)
		return byID, fmt.Sprintf("by its ID; its copies' name labels do not match that ID (%s): a peer's stream may have set them, zfs-controller status lists the copies",
			strings.Join(slices.Compact(mislabelled), "; ")), nil
	case byID != "":
		return byID, "", nil
	case len(named) > 1:
		return "", "", fmt.Errorf("%w: copies of %d volumes are named %q: %s; the volume created with that name has ID %s. Give the ID of the one you mean (zfs-controller status lists the copies)",
			errdefs.ErrInvalidArgument, len(named), arg, strings.Join(named, ", "), contract.VolumeIDForName(arg))
	case len(named) == 1 && named[0] != contract.VolumeIDForName(arg):
		return "", "", fmt.Errorf("%w: the copies named %q are of volume %s, but the volume created with that name has ID %s: their name label does not match their ID (a peer's stream may have set it). Give the ID of the one you mean",
			errdefs.ErrInvalidArgument, arg, named[0], contract.VolumeIDForName(arg))
	case len(named) == 1:
		return named[0], fmt.Sprintf("the volume named %q", arg), nil
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
