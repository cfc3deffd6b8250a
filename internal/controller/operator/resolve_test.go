package operator

import (
	"errors"
	"strings"
	"testing"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// TestANameNeverResolvesSilently: a copy's name is a label a peer's full
// stream set, so a name resolves to a volume only when every copy of that
// name carries one ID and it is the ID a volume of that name has (IDs
// derive from names). A name that copies of two IDs carry is refused,
// listing both, whichever copy answered last; so is a name whose copies
// carry another ID. An ID resolves to itself, and a name label of its
// copies that does not match it is reported.
func TestANameNeverResolvesSilently(t *testing.T) {
	prod := contract.VolumeIDForName("prod-db")
	other := contract.VolumeIDForName("scratch")
	genuine := []CopyStatus{
		{VolumeID: prod, Name: "prod-db", Node: "n1", Role: "primary"},
		{VolumeID: prod, Name: "prod-db", Node: "n2", Role: "replica"},
	}
	planted := CopyStatus{VolumeID: other, Name: "prod-db", Node: "n3", Role: "replica"}
	tests := []struct {
		name   string
		copies []CopyStatus
		arg    string
		id     string
		err    error
		says   []string // in the error, or in how when resolved
	}{
		{"the genuine volume's name", genuine, "prod-db", prod, nil, []string{`the volume named "prod-db"`}},
		{"a name two IDs carry, the planted copy last", append(genuine[:2:2], planted), "prod-db", "", errdefs.ErrInvalidArgument, []string{prod, other, "Give the ID"}},
		{"a name two IDs carry, the planted copy first", append([]CopyStatus{planted}, genuine...), "prod-db", "", errdefs.ErrInvalidArgument, []string{prod, other, "Give the ID"}},
		{"a name only copies of another ID carry", []CopyStatus{planted}, "prod-db", "", errdefs.ErrInvalidArgument, []string{other, prod, "does not match"}},
		{"the ID of a volume a planted copy is named like", append(genuine[:2:2], planted), prod, prod, nil, nil},
		{"an ID whose copy's name label does not match it", []CopyStatus{planted}, other, other, nil, []string{`n3's copy is labelled "prod-db"`, "do not match"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			id, how, err := resolveAmong(tc.copies, tc.arg)
			if id != tc.id || !errors.Is(err, tc.err) {
				t.Fatalf("resolveAmong(%q) = %q, %q, %v; want %q, %v", tc.arg, id, how, err, tc.id, tc.err)
			}
			said := how
			if err != nil {
				said = err.Error()
			}
			for _, want := range tc.says {
				if !strings.Contains(said, want) {
					t.Errorf("resolveAmong(%q) says %q, which does not mention %q", tc.arg, said, want)
				}
			}
		})
	}
}

// TestAnUnresolvedNameSaysWhyNodesDidNotAnswer: a name no answering node
// holds names the nodes that did not answer and why, three at most.
func TestAnUnresolvedNameSaysWhyNodesDidNotAnswer(t *testing.T) {
	down := func(n int) []Unreachable {
		var out []Unreachable
		for i := range n {
			out = append(out, Unreachable{Node: "n" + string(rune('1'+i)), Error: "no answer in time"})
		}
		return out
	}
	for _, tc := range []struct {
		nodes int
		want  string
	}{
		{1, "n1: no answer in time"},
		{3, "n1: no answer in time; n2: no answer in time; n3: no answer in time"},
		{5, "n3: no answer in time; and 2 more (zfs-controller status lists them)"},
	} {
		if got := whyUnanswered(down(tc.nodes)); !strings.HasSuffix(got, tc.want) {
			t.Errorf("%d nodes down: %q, want it to end %q", tc.nodes, got, tc.want)
		}
	}
}
