package replication

import (
	"bytes"
	"encoding/binary"
	"fmt"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// A zfs send stream starts with a DRR_BEGIN record (dmu_replay_record_t in
// OpenZFS's include/sys/zfs_ioctl.h), in the sender's byte order:
//
//	offset  0  uint32 record type (0: DRR_BEGIN)
//	offset  4  uint32 payload length
//	offset  8  uint64 magic, 0x2F5bacbac
//	offset 16  uint64 version info; its low two bits: 1 a substream, 2 a compound stream
//	offset 24  uint64 creation time
//	offset 32  uint32 object set type, uint32 flags
//	offset 40  uint64 GUID of the snapshot sent
//	offset 48  uint64 GUID of the incremental base (0 for a full stream)
//	offset 56  char[256] name of the snapshot sent
//
// The receiver reads it before zfs receive sees a byte: what a peer's
// stream may do is decided here, not by what it says in its header.
const (
	beginRecordSize = 312
	backupMagic     = 0x2F5bacbac
	drrBegin        = 0
	substream       = 1
)

// streamBegin is what the DRR_BEGIN record says of a stream.
type streamBegin struct {
	compound bool   // zfs send -p, -R or -b: carries properties, or more than one dataset
	toGUID   uint64 // the snapshot sent
	fromGUID uint64 // the incremental base; 0 for a full stream
	toName   string
}

// parseBegin reads the DRR_BEGIN record at the start of b.
func parseBegin(b []byte) (streamBegin, error) {
	if len(b) < beginRecordSize {
		return streamBegin{}, fmt.Errorf("the stream ends after %d bytes, before its first record", len(b))
	}
	var order binary.ByteOrder
	switch {
	case binary.LittleEndian.Uint64(b[8:]) == backupMagic:
		order = binary.LittleEndian
	case binary.BigEndian.Uint64(b[8:]) == backupMagic:
		order = binary.BigEndian
	default:
		return streamBegin{}, fmt.Errorf("not a zfs send stream (no magic number in its first record)")
	}
	if t := order.Uint32(b); t != drrBegin {
		return streamBegin{}, fmt.Errorf("the stream's first record is of type %d, not a begin record", t)
	}
	name := b[56:beginRecordSize]
	if i := bytes.IndexByte(name, 0); i >= 0 {
		name = name[:i]
	}
	return streamBegin{
		compound: order.Uint64(b[16:])&3 != substream,
		toGUID:   order.Uint64(b[40:]),
		fromGUID: order.Uint64(b[48:]),
		toName:   string(name),
	}, nil
}

// checkBegin checks a stream's first record against its header's kind.
// Only plain streams of one snapshot are accepted: the pusher never sends
// properties (zfs send without -p), so a compound stream could only set
// properties a peer chose, such as a mountpoint over a host directory,
// setuid, or this driver's own labels. A raw stream's encryption
// parameters travel inside a plain stream's begin record and stay
// allowed.
func checkBegin(b []byte, kind string) error {
	begin, err := parseBegin(b)
	if err != nil {
		return errdefs.Wrap(errdefs.ErrInvalidArgument, "%v", err)
	}
	switch {
	case begin.compound:
		return errdefs.Wrap(errdefs.ErrInvalidArgument, "the stream of %s carries properties or several datasets (zfs send -p or -R): only plain streams are received", begin.toName)
	case kind == KindFull && begin.fromGUID != 0:
		return errdefs.Wrap(errdefs.ErrInvalidArgument, "the header says a full stream, but the stream of %s is incremental", begin.toName)
	case kind == KindIncremental && begin.fromGUID == 0:
		return errdefs.Wrap(errdefs.ErrInvalidArgument, "the header says an incremental stream, but the stream of %s is full", begin.toName)
	}
	return nil
}
