// Package zfsname is the grammar of the ZFS dataset and snapshot names the
// driver accepts. It stands apart from package zfs so that the operator's
// configuration is checked by the same rules in a binary that links no
// ZFS code (zfs-controller).
package zfsname

import (
	"fmt"
	"strings"
)

// Validate refuses anything that is not a plain filesystem or snapshot
// name: no empty components, no "." or "..", no characters ZFS or a shell
// would treat specially, and at most one '@'.
func Validate(name string) error {
	if name == "" || len(name) > 255 {
		return fmt.Errorf("invalid dataset name %q: must be 1 to 255 characters", name)
	}
	fs, snap, isSnap := strings.Cut(name, "@")
	if isSnap && (snap == "" || strings.ContainsAny(snap, "@/")) {
		return fmt.Errorf("invalid snapshot name %q", name)
	}
	for _, part := range strings.Split(fs, "/") {
		if err := validateComponent(part); err != nil {
			return fmt.Errorf("invalid dataset name %q: %w", name, err)
		}
	}
	if isSnap {
		if err := validateComponent(snap); err != nil {
			return fmt.Errorf("invalid snapshot name %q: %w", name, err)
		}
	}
	return nil
}

func validateComponent(c string) error {
	if c == "" || c == "." || c == ".." {
		return fmt.Errorf("component %q is empty or a dot path", c)
	}
	for _, r := range c {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' ||
			r == '_' || r == '-' || r == '.' || r == ':'
		if !ok {
			return fmt.Errorf("component %q has character %q (allowed: letters, digits, _ - . :)", c, r)
		}
	}
	return nil
}
