package replication

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"testing"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// realBegins are the first 80 bytes of streams made by OpenZFS 2.1 in the
// guest (zfs send ... | head -c 312 | od): the rest of the begin record is
// the snapshot name's zero padding.
var realBegins = map[string]string{
	"full (send -L -c p/src@s1)":          "0000000000000000accbbaf50200000011000801000000004243046b00000000020000000c00000011c8c603954c359c0000000000000000702f73726340733100000000000000000000000000000000",
	"incremental (send -L -c -i @s1 @s2)": "0000000000000000accbbaf50200000011000801000000004243046b00000000020000000c00000025d8915a3d43d53f11c8c603954c359c702f73726340733200000000000000000000000000000000",
	"with properties (send -p @s1)":       "00000000dc010000accbbaf50200000002000000000000000000000000000000000000000000000000000000000000000000000000000000702f73726340733100000000000000000000000000000000",
	"raw (send -w p/enc@e1)":              "0000000004040000accbbaf50200000011000805000000004843046b00000000020000000c00000017af4453bedb68680000000000000000702f656e6340653100000000000000000000000000000000",
	"resumed (send -t of @s1)":            "0000000060000000accbbaf50200000011004801000000004243046b00000000020000000c00000011c8c603954c359c0000000000000000702f73726340733100000000000000000000000000000000",
}

func realBegin(t *testing.T, name string) []byte {
	t.Helper()
	b, err := hex.DecodeString(realBegins[name])
	if err != nil || len(b) == 0 {
		t.Fatalf("no real begin record %q: %v", name, err)
	}
	return append(b, make([]byte, beginRecordSize-len(b))...)
}

// testBegin is a plain stream's begin record, as the tests' peers send.
func testBegin(fromGUID, toGUID uint64, toName string) []byte {
	b := make([]byte, beginRecordSize)
	binary.LittleEndian.PutUint64(b[8:], backupMagic)
	binary.LittleEndian.PutUint64(b[16:], 0x01080011)
	binary.LittleEndian.PutUint64(b[40:], toGUID)
	binary.LittleEndian.PutUint64(b[48:], fromGUID)
	copy(b[56:], toName)
	return b
}

func TestCheckBegin(t *testing.T) {
	bigEndian := testBegin(0, 7, "p/v@s")
	for _, at := range []int{8, 16, 40, 48} {
		binary.BigEndian.PutUint64(bigEndian[at:], binary.LittleEndian.Uint64(bigEndian[at:]))
	}
	tests := []struct {
		name   string
		stream []byte
		kind   string
		want   error // nil: accepted
		to     string
	}{
		{"a real full stream", realBegin(t, "full (send -L -c p/src@s1)"), KindFull, nil, "p/src@s1"},
		{"a real incremental stream", realBegin(t, "incremental (send -L -c -i @s1 @s2)"), KindIncremental, nil, "p/src@s2"},
		{"a real raw stream", realBegin(t, "raw (send -w p/enc@e1)"), KindFull, nil, "p/enc@e1"},
		{"a real resumed stream", realBegin(t, "resumed (send -t of @s1)"), KindResume, nil, "p/src@s1"},
		{"a stream from a big-endian sender", bigEndian, KindFull, nil, "p/v@s"},
		{"a stream carrying properties", realBegin(t, "with properties (send -p @s1)"), KindFull, errdefs.ErrInvalidArgument, ""},
		{"an incremental stream said to be full", realBegin(t, "incremental (send -L -c -i @s1 @s2)"), KindFull, errdefs.ErrInvalidArgument, ""},
		{"a full stream said to be incremental", realBegin(t, "full (send -L -c p/src@s1)"), KindIncremental, errdefs.ErrInvalidArgument, ""},
		{"no stream at all", []byte("stream"), KindFull, errdefs.ErrInvalidArgument, ""},
		{"bytes that are no stream", make([]byte, beginRecordSize), KindFull, errdefs.ErrInvalidArgument, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := checkBegin(tt.stream, tt.kind)
			if tt.want == nil {
				if err != nil {
					t.Fatal(err)
				}
				if begin, _ := parseBegin(tt.stream); begin.toName != tt.to {
					t.Errorf("snapshot %q, want %q", begin.toName, tt.to)
				}
				return
			}
			if !errors.Is(err, tt.want) {
				t.Errorf("%v, want %v", err, tt.want)
			}
		})
	}
}
