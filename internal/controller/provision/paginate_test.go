package provision

import (
	"errors"
	"sort"
	"testing"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

func TestPaginate(t *testing.T) {
	ids := []string{contract.VolumeIDForName("a"), contract.VolumeIDForName("b"), contract.VolumeIDForName("c"), contract.VolumeIDForName("d"), contract.VolumeIDForName("e")}
	sort.Strings(ids)
	key := func(s string) string { return s }

	// Walking all pages of 2 returns every item once, in order.
	var seen []string
	token := ""
	for pages := 0; pages < 10; pages++ {
		page, next, err := paginate(ids, key, token, 2, contract.IsVolumeID)
		if err != nil {
			t.Fatal(err)
		}
		seen = append(seen, page...)
		if next == "" {
			break
		}
		token = next
	}
	if len(seen) != len(ids) {
		t.Fatalf("pages returned %v, want %v", seen, ids)
	}
	for i := range ids {
		if seen[i] != ids[i] {
			t.Fatalf("pages returned %v, want %v", seen, ids)
		}
	}

	tests := []struct {
		name  string
		token string
		max   int32
		n     int
		err   error
	}{
		{"all at once", "", 0, 5, nil},
		{"bad token", "not-a-token", 2, 0, errdefs.ErrAborted},
		{"negative max", "", -1, 0, errdefs.ErrInvalidArgument},
		{"token past the end", "vol-ffffffffffffffffffff", 2, 0, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			page, _, err := paginate(ids, key, tc.token, tc.max, contract.IsVolumeID)
			if !errors.Is(err, tc.err) || len(page) != tc.n {
				t.Fatalf("got %d items, %v; want %d, %v", len(page), err, tc.n, tc.err)
			}
		})
	}
}
