package copyrecord

import (
	"strings"
	"testing"
)

func TestPromiseRecordsReadWhatTheyWrite(t *testing.T) {
	for _, tc := range []struct {
		value string
		want  Promise
	}{
		{"4 n2", Promise{Generation: 4, Holder: "n2"}},
		{Promise{Generation: 7, Holder: "zn-deletion"}.String(), Promise{Generation: 7, Holder: "zn-deletion"}},
		{"-", Promise{}},                       // ZFS's unset value
		{"", Promise{}},                        // no record
		{"n2 4", Promise{}},                    // no generation first: no promise
		{"-1 n2", Promise{}},                   // no generation is negative
		{"18446744073709551616 n2", Promise{}}, // past uint64
	} {
		if got := ParsePromise(tc.value); got != tc.want {
			t.Errorf("ParsePromise(%q) = %+v, want %+v", tc.value, got, tc.want)
		}
	}
}

func TestPromiseShardsStayUnderTheRecordsDataset(t *testing.T) {
	for _, id := range []string{"vol-00", "vol-3f", "vol-ff", "vol-abc41"} {
		shard := PromiseShard("tank/nomad", id)
		if !strings.HasPrefix(shard, "tank/nomad/"+PromisesDataset+"/") {
			t.Errorf("PromiseShard(%s) = %s, want it under tank/nomad/%s", id, shard, PromisesDataset)
		}
	}
	if PromiseShard("r", "vol-41") == PromiseShard("r", "vol-42") {
		t.Error("two volume IDs ending in different hex digits share a shard")
	}
}

func TestDeletedSnapshotRecordsReadWhatTheyWrite(t *testing.T) {
	const snap = "snap-0123456789abcdef0123"
	d := DeletedSnapshot{ID: snap, SourceVolumeID: "vol-0123456789abcdef0123", CreatedUnix: 1764800000}
	if got, ok := ParseDeletedSnapshot(snap, d.String()); !ok || got != d {
		t.Errorf("ParseDeletedSnapshot(%q) = %+v, %v, want %+v", d.String(), got, ok, d)
	}
	for _, tc := range []struct{ id, value string }{
		{"vol-0123456789abcdef0123", d.String()}, // not a snapshot ID
		{snap, "yesterday vol-1"},                // no creation time
		{snap, ""},
	} {
		if got, ok := ParseDeletedSnapshot(tc.id, tc.value); ok {
			t.Errorf("ParseDeletedSnapshot(%q, %q) = %+v, want no record", tc.id, tc.value, got)
		}
	}
}
