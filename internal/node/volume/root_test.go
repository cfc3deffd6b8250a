package volume

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/config"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// fakeRoots records the roots it was asked to prepare; failures makes the
// next that many calls fail.
type fakeRoots struct {
	calls    []string
	failures int
}

func (f *fakeRoots) PrepareRoot(_ context.Context, dataset string, uid, gid, mode int) error {
	call := fmt.Sprintf("%s %s", dataset, Root{uid, gid, mode})
	if f.failures > 0 {
		f.failures--
		return errors.New("mount failed")
	}
	f.calls = append(f.calls, call)
	return nil
}

func newRootManager(t *testing.T) (*Manager, *fakeRoots) {
	t.Helper()
	m, _ := newManager(t)
	m.cfg.RootDirectory = config.RootDirectory{UIDs: []string{"1000-1999", "65534"}, GIDs: []string{"100"}, ModeMask: "2775"}
	roots := &fakeRoots{}
	m.host.Roots = roots
	return m, roots
}

func TestRootParametersWithinTheOperatorsRules(t *testing.T) {
	tests := []struct {
		params map[string]string
		want   string // the PrepareRoot call; "" for none
		err    string // part of the InvalidArgument message; "" for success
	}{
		{map[string]string{}, "", ""},
		{map[string]string{"uid": "1000"}, "tank/nomad/ID uid 1000", ""},
		{map[string]string{"uid": "65534", "gid": "100", "mode": "0750"}, "tank/nomad/ID uid 65534, gid 100, mode 0750", ""},
		{map[string]string{"mode": "2770"}, "tank/nomad/ID mode 2770", ""},
		{map[string]string{"mode": "770"}, "tank/nomad/ID mode 0770", ""},
		{map[string]string{"uid": "0"}, "", `the operator allows 1000-1999, 65534 (root_directory.uids`},
		{map[string]string{"uid": "2000"}, "", "the operator allows 1000-1999, 65534"},
		{map[string]string{"gid": "101"}, "", "the operator allows 100 (root_directory.gids"},
		{map[string]string{"uid": "-1"}, "", "not a user or group ID"},
		{map[string]string{"uid": "4294967295"}, "", "not a user or group ID"},
		{map[string]string{"uid": "1e3"}, "", "not a user or group ID"},
		{map[string]string{"mode": "0777"}, "", "sets bits 0002 that the operator does not allow"},
		{map[string]string{"mode": "4755"}, "", "sets bits 4000"},
		{map[string]string{"mode": "0758"}, "", "not an octal mode"},
		{map[string]string{"mode": "17777"}, "", "not an octal mode"},
		{map[string]string{"mode": ""}, "", "not an octal mode"},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprint(tc.params), func(t *testing.T) {
			m, roots := newRootManager(t)
			v, err := m.Create(context.Background(), CreateRequest{Name: "owned", Parameters: tc.params})
			if tc.err != "" {
				if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got %v, want InvalidArgument containing %q", err, tc.err)
				}
				if len(roots.calls) > 0 {
					t.Errorf("a refused create prepared %v", roots.calls)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var want []string
			if tc.want != "" {
				want = []string{strings.Replace(tc.want, "ID", v.ID, 1)}
			}
			if fmt.Sprint(roots.calls) != fmt.Sprint(want) {
				t.Errorf("prepared %v, want %v", roots.calls, want)
			}
			if v.RootPending {
				t.Error("the volume still marks its root as pending")
			}
		})
	}
}

func TestRootParametersNeedTheOperatorsRules(t *testing.T) {
	m, _ := newManager(t) // the default config allows no uid or gid
	m.host.Roots = &fakeRoots{}
	_, err := m.Create(context.Background(), CreateRequest{Name: "owned", Parameters: map[string]string{"uid": "1000"}})
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "the operator allows none") {
		t.Fatalf("got %v, want InvalidArgument saying the operator allows none", err)
	}
	// The mode within the default mask needs no rule.
	if _, err := m.Create(context.Background(), CreateRequest{Name: "moded", Parameters: map[string]string{"mode": "0700"}}); err != nil {
		t.Fatal(err)
	}
}

// A create whose root preparation fails leaves the volume marked, and its
// retry, which finds the volume, prepares the root and clears the mark;
// after that a retry prepares nothing again.
func TestACreateThatStoppedHalfWayIsFinishedByItsRetry(t *testing.T) {
	m, roots := newRootManager(t)
	ctx := context.Background()
	req := CreateRequest{Name: "owned", Parameters: map[string]string{"uid": "1000", "mode": "0700"}}
	roots.failures = 1
	if _, err := m.Create(ctx, req); err == nil || !strings.Contains(err.Error(), "retry the create") {
		t.Fatalf("got %v, want the preparation's failure", err)
	}
	v, err := m.Get(ctx, contract.VolumeIDForName(req.Name))
	if err != nil || !v.RootPending {
		t.Fatalf("after the failure: %+v, %v; want the volume marked pending", v, err)
	}
	for i := 0; i < 2; i++ {
		v = create(t, m, req)
		if v.RootPending {
			t.Fatalf("retry %d: still pending", i+1)
		}
	}
	if want := []string{v.Dataset + " uid 1000, mode 0700"}; fmt.Sprint(roots.calls) != fmt.Sprint(want) {
		t.Errorf("prepared %v, want %v (once)", roots.calls, want)
	}
	// A retry with other root parameters is another volume's request.
	other := CreateRequest{Name: "owned", Parameters: map[string]string{"uid": "1001", "mode": "0700"}}
	if _, err := m.Create(ctx, other); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("create with another uid: %v, want AlreadyExists", err)
	}
}

func TestRootParametersOnANodeThatCannotSetThem(t *testing.T) {
	m, _ := newRootManager(t)
	m.host.Roots = nil
	_, err := m.Create(context.Background(), CreateRequest{Name: "owned", Parameters: map[string]string{"uid": "1000"}})
	if !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("got %v, want FailedPrecondition", err)
	}
	if _, err := m.Get(context.Background(), contract.VolumeIDForName("owned")); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("the refused create left a volume: %v", err)
	}
}
