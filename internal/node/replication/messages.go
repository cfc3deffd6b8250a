package replication

import (
	"context"
	"io"
)

// What a push and the receiving node say to each other, in plain types:
// the node's gRPC adapter (package agent) turns them into the agent
// protocol's messages (proto/agentpb) and back, so this package is tested
// and fault-injected without gRPC.

// Header says what a stream is: the first message of every stream a push
// sends.
type Header struct {
	VolumeID, VolumeName string
	// SourceNodeID is the sending node; the receiver holds it to the node
	// the sender's certificate names.
	SourceNodeID string
	// Kind is KindFull, KindIncremental or KindResume; Snapshot the short
	// name of the snapshot the stream ends at (none when resuming).
	Kind, Snapshot string
	// Generation is the sender's primary's; Parameters and CapacityBytes
	// what a replica needs to become the primary one day.
	Generation    uint64
	Parameters    map[string]string
	CapacityBytes uint64
	// HistoryFrom is the oldest generation whose every snapshot is an
	// earlier state of the sender's copy (replication.md, "Replicas of an
	// older generation").
	HistoryFrom uint64
	// PeerBases are the snapshots the sender holds as the bases of its
	// other replicas (replication.md, "Replicas share a base").
	PeerBases []PeerBase
}

// PeerBase is the snapshot, by GUID, a sender holds as node NodeID's
// base.
type PeerBase struct {
	GUID   uint64
	NodeID string
}

// ReplicaState is what a node holds of a volume, as a push asks before
// it plans its stream.
type ReplicaState struct {
	// Exists: the node holds a copy; Role is then RoleReplica or the
	// primary's role.
	Exists bool
	Role   string
	// SnapshotGUIDs are the copy's snapshots.
	SnapshotGUIDs []uint64
	// ResumeToken is set when an interrupted receive can be resumed.
	ResumeToken string
	// NodeID is the answering node, after whom the sender's base hold is
	// named; Generation the primary's the replica was last received from.
	NodeID     string
	Generation uint64
}

// Received is a receiver's answer to a stream it took in whole: the
// snapshot it now holds and the bytes it read.
type Received struct {
	SnapshotGUID uint64
	Bytes        int64
}

// Incoming is one stream as the receiver reads it: its header, then the
// zfs send stream's bytes. Reads block until the sender sends; the
// receiver bounds each wait (stallGuard) and gives up on a stalled one by
// returning, which ends the stream and the blocked read.
type Incoming interface {
	// Header reads the stream's first message, its header.
	Header() (Header, error)
	// Read reads the stream's bytes after the header; io.EOF after the
	// last.
	io.Reader
}

// Peer is a receiving node as a push calls it, held to the node its
// certificate names (from agent.ReplicationPeers, over the agent port).
type Peer interface {
	// ReplicaState asks what the node holds of volumeID.
	ReplicaState(ctx context.Context, volumeID string) (ReplicaState, error)
	// Receive opens a stream to the node and sends its header.
	Receive(ctx context.Context, h Header) (Outgoing, error)
}

// Outgoing is one stream as a push sends it.
type Outgoing interface {
	// Send sends the next chunk of the zfs send stream. An error means the
	// stream broke: the receiver may have refused it or given up, and
	// CloseAndRecv says why.
	Send(chunk []byte) error
	// CloseAndRecv ends the stream and returns the receiver's answer:
	// what it received, or why it refused or failed (an errdefs kind).
	CloseAndRecv() (Received, error)
}
