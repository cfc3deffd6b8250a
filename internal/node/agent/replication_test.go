package agent

import (
	"context"
	"errors"
	"io"
	"testing"

	"google.golang.org/grpc"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
	pb "github.com/zfs-nomad/zfs-nomad/proto/agentpb"
)

// receiveStream is the server side of a Receive stream that delivers msgs.
type receiveStream struct {
	grpc.ServerStream
	msgs []*pb.ReceiveMessage
}

func (s *receiveStream) Recv() (*pb.ReceiveMessage, error) {
	if len(s.msgs) == 0 {
		return nil, io.EOF
	}
	m := s.msgs[0]
	s.msgs = s.msgs[1:]
	return m, nil
}

func (s *receiveStream) SendAndClose(*pb.ReceiveResult) error { return nil }
func (s *receiveStream) Context() context.Context             { return context.Background() }

func headerMsg(id string) *pb.ReceiveMessage {
	return &pb.ReceiveMessage{Msg: &pb.ReceiveMessage_Header{Header: &pb.ReceiveHeader{VolumeId: id, Generation: 3,
		PeerBases: []*pb.PeerBase{{Guid: 7, NodeId: "n3"}}}}}
}

func dataMsg(b string) *pb.ReceiveMessage {
	return &pb.ReceiveMessage{Msg: &pb.ReceiveMessage_Data{Data: []byte(b)}}
}

// TestIncomingReadsAHeaderThenTheBytes: the receiver reads a Receive
// stream as its header and then the bytes of its data messages, whatever
// the size of its reads; a stream that does not start with a header, or
// carries a second, is refused with InvalidArgument.
func TestIncomingReadsAHeaderThenTheBytes(t *testing.T) {
	in := &incoming{stream: &receiveStream{msgs: []*pb.ReceiveMessage{headerMsg("vol-1"), dataMsg("abc"), dataMsg(""), dataMsg("defgh")}}}
	h, err := in.Header()
	if err != nil || h.VolumeID != "vol-1" || h.Generation != 3 || len(h.PeerBases) != 1 || h.PeerBases[0].GUID != 7 || h.PeerBases[0].NodeID != "n3" {
		t.Fatalf("header: %+v, %v", h, err)
	}
	var got []byte
	buf := make([]byte, 2)
	for {
		n, err := in.Read(buf)
		got = append(got, buf[:n]...)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if string(got) != "abcdefgh" {
		t.Errorf("read %q, want abcdefgh", got)
	}

	noHeader := &incoming{stream: &receiveStream{msgs: []*pb.ReceiveMessage{dataMsg("abc")}}}
	if _, err := noHeader.Header(); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("a stream that starts with data: %v, want InvalidArgument", err)
	}
	twoHeaders := &incoming{stream: &receiveStream{msgs: []*pb.ReceiveMessage{headerMsg("vol-1"), headerMsg("vol-2")}}}
	if _, err := twoHeaders.Header(); err != nil {
		t.Fatal(err)
	}
	if _, err := twoHeaders.Read(buf); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("a second header: %v, want InvalidArgument", err)
	}
}

// TestHeadersCrossTheWireWhole: every field of a header survives the
// adapter's conversion both ways.
func TestHeadersCrossTheWireWhole(t *testing.T) {
	h := headerFromPB(&pb.ReceiveHeader{VolumeId: "v", VolumeName: "web", SourceNodeId: "n1", Kind: "full", Snapshot: "zn-1",
		Generation: 2, Parameters: map[string]string{"a": "b"}, CapacityBytes: 5, HistoryFrom: 1, PeerBases: []*pb.PeerBase{{Guid: 9, NodeId: "n4"}}})
	back := headerToPB(h)
	again := headerFromPB(back)
	if again.VolumeID != "v" || again.VolumeName != "web" || again.SourceNodeID != "n1" || again.Kind != "full" || again.Snapshot != "zn-1" ||
		again.Generation != 2 || again.Parameters["a"] != "b" || again.CapacityBytes != 5 || again.HistoryFrom != 1 ||
		len(again.PeerBases) != 1 || again.PeerBases[0] != h.PeerBases[0] || h.PeerBases[0].GUID != 9 {
		t.Errorf("after two conversions: %+v", again)
	}
}
