package config

import (
	"fmt"
	"strconv"
	"strings"
)

// RootDirectory is what volumes may ask for their root directory's owner
// and mode (parameters uid, gid and mode). A volume is created with its
// root owned by root, mode 0755, unless it asks otherwise; a volume may
// ask only for what the operator lists here.
type RootDirectory struct {
	// UIDs and GIDs are the user and group IDs a volume's root may be
	// owned by: single IDs ("1000") and ranges ("1000-65534"). Empty: the
	// parameter is refused.
	UIDs []string `json:"uids"`
	GIDs []string `json:"gids"`
	// ModeMask is the octal mode bits a mode parameter may set ("2775":
	// setgid and everything but writes by others). Empty: DefaultModeMask.
	ModeMask string `json:"mode_mask"`
}

// DefaultModeMask lets a volume give its root any permission bits but
// write by others, and setgid, which makes new files take the directory's
// group: the mount is inside the task's allocation directory, and a
// world-writable one would be writable by any user on the client.
const DefaultModeMask = "2775"

// maxID is the largest user or group ID Linux accepts ((uid_t)-1 is "no
// change").
const maxID = 1<<32 - 2

func (r RootDirectory) validate() []error {
	var errs []error
	for _, list := range []struct {
		key    string
		ranges []string
	}{{"uids", r.UIDs}, {"gids", r.GIDs}} {
		for _, s := range list.ranges {
			if _, _, err := parseIDRange(s); err != nil {
				errs = append(errs, fmt.Errorf("root_directory.%s: %w", list.key, err))
			}
		}
	}
	if _, err := r.Mask(); err != nil {
		errs = append(errs, fmt.Errorf("root_directory.mode_mask: %w", err))
	}
	return errs
}

// Mask returns ModeMask's bits.
func (r RootDirectory) Mask() (uint32, error) {
	if r.ModeMask == "" {
		return ParseMode(DefaultModeMask)
	}
	return ParseMode(r.ModeMask)
}

// AllowsUID reports whether a volume's root may be owned by user id.
func (r RootDirectory) AllowsUID(id uint32) bool { return inRanges(r.UIDs, id) }

// AllowsGID reports whether a volume's root may be owned by group id.
func (r RootDirectory) AllowsGID(id uint32) bool { return inRanges(r.GIDs, id) }

func inRanges(ranges []string, id uint32) bool {
	for _, s := range ranges {
		if lo, hi, err := parseIDRange(s); err == nil && lo <= id && id <= hi {
			return true
		}
	}
	return false
}

// ParseID reads a user or group ID.
func ParseID(s string) (uint32, error) {
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil || n > maxID {
		return 0, fmt.Errorf("%q is not a user or group ID (a whole number from 0 to %d)", s, uint64(maxID))
	}
	return uint32(n), nil
}

func parseIDRange(s string) (lo, hi uint32, err error) {
	from, to, isRange := strings.Cut(s, "-")
	if lo, err = ParseID(from); err != nil {
		return 0, 0, fmt.Errorf("%q: want an ID or a range such as 1000-65534: %w", s, err)
	}
	if !isRange {
		return lo, lo, nil
	}
	if hi, err = ParseID(to); err != nil || hi < lo {
		return 0, 0, fmt.Errorf("%q: want an ID or a range such as 1000-65534, lowest first", s)
	}
	return lo, hi, nil
}

// ParseMode reads an octal file mode of permission bits and setuid,
// setgid and sticky ("0750", "2775", "750").
func ParseMode(s string) (uint32, error) {
	n, err := strconv.ParseUint(s, 8, 32)
	if err != nil || len(s) > 5 || n > 0o7777 {
		return 0, fmt.Errorf("%q is not an octal mode such as 0750 (at most 7777)", s)
	}
	return uint32(n), nil
}
