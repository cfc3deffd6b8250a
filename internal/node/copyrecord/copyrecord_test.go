package copyrecord

import (
	"maps"
	"testing"
	"time"
)

func TestHistoryFrom(t *testing.T) {
	tests := []struct {
		value      string
		generation uint64
		want       uint64
	}{
		{"", 3, 3},                     // unset: only the copy's own generation is vouched for
		{"-", 3, 3},                    // damaged: the same
		{"0", 3, 3},                    // zero reads as unset
		{"1", 3, 1},                    // a planned move kept the history from generation 1
		{"3", 3, 3},                    // a failover started it afresh
		{"4", 3, 3},                    // past the copy's generation: nothing older is vouched for
		{"2", 2, 2},                    // its own generation
		{"-1", 5, 5},                   // negative: not a generation
		{"7x", 9, 9},                   // trailing garbage: not a generation
		{"18446744073709551615", 2, 2}, // past any generation
	}
	for _, tt := range tests {
		if got := HistoryFrom(tt.value, tt.generation); got != tt.want {
			t.Errorf("HistoryFrom(%q, %d) = %d, want %d", tt.value, tt.generation, got, tt.want)
		}
	}
}

func TestDemotedAt(t *testing.T) {
	tests := []struct {
		value string
		want  time.Time
	}{
		{"1700000000", time.Unix(1700000000, 0)},
		{"-", time.Time{}}, // promoted since
		{"", time.Time{}},  // never demoted
		{"0", time.Time{}},
		{"-5", time.Time{}},
		{"soon", time.Time{}},
	}
	for _, tt := range tests {
		if got := DemotedAt(tt.value); !got.Equal(tt.want) {
			t.Errorf("DemotedAt(%q) = %v, want %v", tt.value, got, tt.want)
		}
	}
}

func TestMovingTo(t *testing.T) {
	tests := []struct{ value, want string }{
		{"n2", "n2"},
		{NotMoving, ""}, // unfenced
		{"", ""},        // never fenced (a replica, an older node's primary)
	}
	for _, tt := range tests {
		if got := MovingTo(tt.value); got != tt.want {
			t.Errorf("MovingTo(%q) = %q, want %q", tt.value, got, tt.want)
		}
	}
}

func TestParametersRoundTrip(t *testing.T) {
	tests := []struct {
		params map[string]string
		stored string
	}{
		{nil, "{}"},
		{map[string]string{}, "{}"},
		// Canonical: the keys sorted, whatever order the map gives them.
		{map[string]string{"quota": "1G", "compression": "lz4", "a": `"quoted"`}, `{"a":"\"quoted\"","compression":"lz4","quota":"1G"}`},
	}
	for _, tt := range tests {
		stored := EncodeParameters(tt.params)
		if stored != tt.stored {
			t.Errorf("EncodeParameters(%v) = %s, want %s", tt.params, stored, tt.stored)
		}
		if back := DecodeParameters(stored); !maps.Equal(back, tt.params) && len(back)+len(tt.params) > 0 {
			t.Errorf("DecodeParameters(%s) = %v, want %v", stored, back, tt.params)
		}
	}
	for _, damaged := range []string{"", "-", "{", "[]", `{"a":1}`, `{"a":"b","c":2}`} {
		if got := DecodeParameters(damaged); len(got) != 0 {
			t.Errorf("DecodeParameters(%q) = %v, want no parameters", damaged, got)
		}
	}
}

func TestCopyNamesAreNoVolumeIDs(t *testing.T) {
	at := time.Unix(0, 1234)
	if got, want := AsideName("pool/nomad/vol-1", at), "pool/nomad/vol-1-aside-1234"; got != want {
		t.Errorf("AsideName = %s, want %s", got, want)
	}
	if got, want := TombstoneName("pool/nomad/vol-1", at), "pool/nomad/vol-1-deleted-1234"; got != want {
		t.Errorf("TombstoneName = %s, want %s", got, want)
	}
}
