package zfscmd

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
)

// PoolSpace is a pool's size and what of it is allocated and free, in
// bytes, as zpool list reports them (raw space: before redundancy).
type PoolSpace struct {
	Size, Allocated, Free uint64
}

// ReadPoolSpace runs `zpool list -Hp -o size,allocated,free pool`: a read
// of the pool's own accounting, which libzfs's dataset properties do not
// give (they give a dataset's used and available).
func ReadPoolSpace(ctx context.Context, pool string) (PoolSpace, error) {
	out, err := exec.CommandContext(ctx, "zpool", "list", "-Hp", "-o", "size,allocated,free", pool).Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			err = fmt.Errorf("%w: %s", err, strings.TrimSpace(string(ee.Stderr)))
		}
		return PoolSpace{}, fmt.Errorf("zpool list %s: %w", pool, err)
	}
	return parsePoolSpace(string(out))
}

// parsePoolSpace reads zpool list's one line of three tab-separated
// byte counts.
func parsePoolSpace(out string) (PoolSpace, error) {
	fields := strings.Split(strings.TrimSpace(out), "\t")
	if len(fields) != 3 {
		return PoolSpace{}, fmt.Errorf("zpool list: want size, allocated and free, got %q", out)
	}
	var v [3]uint64
	for i, f := range fields {
		n, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			return PoolSpace{}, fmt.Errorf("zpool list: %q is not a byte count: %w", f, err)
		}
		v[i] = n
	}
	return PoolSpace{Size: v[0], Allocated: v[1], Free: v[2]}, nil
}
