package witnesses

import (
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	three := []string{"n1@10.0.0.1:7670", "n2@10.0.0.2:7670", "n3@10.0.0.3:7670"}
	tests := []struct {
		name    string
		entries []string
		wantLen int
		wantErr string
	}{
		{"none: every node counts", nil, 0, ""},
		{"three", three, 3, ""},
		{"spaces around an entry", []string{" n1@a:1", "n2@b:1 ", "n3@c:1"}, 3, ""},
		{"one is the cluster's only vote", three[:1], 0, "odd number from 3"},
		{"even", append(three, "n4@10.0.0.4:7670"), 0, "odd number from 3"},
		{"too many", []string{"a@a:1", "b@b:1", "c@c:1", "d@d:1", "e@e:1", "f@f:1", "g@g:1", "h@h:1", "i@i:1", "j@j:1", "k@k:1"}, 0, "odd number from 3 to 9"},
		{"no node ID", []string{"10.0.0.1:7670", "n2@b:1", "n3@c:1"}, 0, "node_id@host:port"},
		{"no port", []string{"n1@10.0.0.1", "n2@b:1", "n3@c:1"}, 0, "host:port"},
		{"a node twice", []string{"n1@a:1", "n1@b:1", "n3@c:1"}, 0, "listed twice"},
		{"an address twice", []string{"n1@a:1", "n2@a:1", "n3@c:1"}, 0, "its own agent address"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Parse(tt.entries)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Parse(%q) = %v, want an error with %q", tt.entries, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if s.Len() != tt.wantLen || s.Empty() != (tt.wantLen == 0) {
				t.Errorf("Parse(%q): %d witnesses (empty %v), want %d", tt.entries, s.Len(), s.Empty(), tt.wantLen)
			}
		})
	}
}

func TestMajority(t *testing.T) {
	s, err := Parse([]string{"w1@a:1", "w2@b:1", "w3@c:1"})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		ids  []string
		want bool
	}{
		{nil, false},
		{[]string{"w1"}, false},
		{[]string{"w1", "w1"}, false},             // a node counts once
		{[]string{"w1", "n4", "n5", "n6"}, false}, // nodes that are not witnesses count for nothing
		{[]string{"w1", "w3"}, true},
		{[]string{"w3", "n9", "w2", "w1"}, true},
	}
	for _, tt := range tests {
		if got := s.Majority(tt.ids); got != tt.want {
			t.Errorf("Majority(%v) = %v, want %v", tt.ids, got, tt.want)
		}
	}
}

func TestDigest(t *testing.T) {
	parse := func(entries ...string) Set {
		s, err := Parse(entries)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	a := parse("w1@a:1", "w2@b:1", "w3@c:1")
	if got := parse("w3@c:1", "w1@a:1", "w2@b:1").Digest(); got != a.Digest() {
		t.Errorf("the same set listed in another order has digest %s, want %s", got, a.Digest())
	}
	for _, other := range []Set{parse("w1@a:1", "w2@b:1", "w4@c:1"), parse("w1@a:1", "w2@b:1", "w3@c:2")} {
		if other.Digest() == a.Digest() {
			t.Errorf("sets %s and %s share digest %s", a, other, a.Digest())
		}
	}
	if (Set{}).Digest() != "" {
		t.Error("the empty set has a digest")
	}
}
