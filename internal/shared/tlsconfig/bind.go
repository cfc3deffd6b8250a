package tlsconfig

import (
	"context"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// Every node certificate carries the same DNS name (ServerName), so the
// handshake proves only that the server is some node. Which node is the
// certificate's common name: the node ID. A dialler that knows whom it
// dials holds the connection to that name here (Bind), and one that knows
// only an address holds the server to the node ID it says it is (Claims):
// otherwise any node's certificate could answer as any node, and its
// answers (a promise, a replica's state, "I do not hold it") would count
// as another node's.

// ServerNode returns the node ID the verified server certificate of a
// call names (its common name), as the client sees it. ok is false when
// the call had no verified certificate: an insecure test port, the
// simulation's in-memory network, or a call that reached no server.
func ServerNode(p *peer.Peer) (name string, ok bool) {
	if p == nil {
		return "", false
	}
	info, isTLS := p.AuthInfo.(credentials.TLSInfo)
	if !isTLS || len(info.State.VerifiedChains) == 0 || len(info.State.VerifiedChains[0]) == 0 {
		return "", false
	}
	return info.State.VerifiedChains[0][0].Subject.CommonName, true
}

// CheckClaim checks that the node ID an answer names is the node the
// verified server certificate of its call (p, from grpc.Peer) names: a
// node may answer only as itself. Without a verified certificate it
// checks nothing. It fails with PermissionDenied, as a gRPC status.
func CheckClaim(p *peer.Peer, nodeID string) error {
	if name, ok := ServerNode(p); ok && name != nodeID {
		return status.Errorf(codes.PermissionDenied,
			"an agent whose certificate names node %q answered as node %q: a node may answer only as itself "+
				"(check that each node's certificate has its own node_id as its common name, and the peer addresses)", name, nodeID)
	}
	return nil
}

// Bound is a connection to one node's agent: every call through it must
// be answered by a server whose verified certificate names that node, or
// it fails with PermissionDenied (the answer, or the stream, is not
// used). Calls without a verified certificate pass unchecked (see
// ServerNode). It is a grpc.ClientConnInterface, for any generated client.
type Bound struct {
	conn grpc.ClientConnInterface

	mu   sync.Mutex
	node string // the only node that may answer; "" until the first answer
}

// Bind returns conn held to the node nodeID. With nodeID "", the first
// verified server certificate that answers decides the node, and every
// later answer must come from the same node: the caller then checks with
// Claims that the node is the one it says it is.
func Bind(conn grpc.ClientConnInterface, nodeID string) *Bound {
	return &Bound{conn: conn, node: nodeID}
}

// Node returns the node the connection is held to: the one it was bound
// to, else the one whose certificate answered first ("" before that, or
// without TLS).
func (b *Bound) Node() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.node
}

// Claims checks that a node ID an answer names (GetNode's, a replica
// state's, a ping's) is the node the connection is held to: a node may
// answer only as itself. It fails with PermissionDenied, as a gRPC status.
func (b *Bound) Claims(nodeID string) error {
	if node := b.Node(); node != "" && node != nodeID {
		return status.Errorf(codes.PermissionDenied,
			"an agent whose certificate names node %q answered as node %q: a node may answer only as itself "+
				"(check that each node's certificate has its own node_id as its common name, and the peer addresses)", node, nodeID)
	}
	return nil
}

// check holds the server of a call to the connection's node, deciding it
// on the first verified answer.
func (b *Bound) check(p *peer.Peer) error {
	name, ok := ServerNode(p)
	if !ok {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.node == "" {
		b.node = name
		return nil
	}
	if name != b.node {
		return status.Errorf(codes.PermissionDenied,
			"the agent that answered has node %q's certificate, not node %q's: refusing its answer "+
				"(check the peer addresses, and that each node's certificate names its own node_id)", name, b.node)
	}
	return nil
}

// Invoke makes a unary call and refuses its answer, or its error, when
// another node answered: a liar's NotFound must not count either.
func (b *Bound) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	var p peer.Peer
	err := b.conn.Invoke(ctx, method, args, reply, append(opts, grpc.Peer(&p))...)
	if cerr := b.check(&p); cerr != nil {
		return cerr
	}
	return err
}

// NewStream opens a stream and checks its server before anything is sent
// on it: the stream's transport, and so its peer, is known once it opens.
func (b *Bound) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	ctx, cancel := context.WithCancel(ctx)
	s, err := b.conn.NewStream(ctx, desc, method, opts...)
	if err != nil {
		cancel()
		return nil, err
	}
	p, _ := peer.FromContext(s.Context())
	if err := b.check(p); err != nil {
		cancel()
		return nil, err
	}
	return &boundStream{ClientStream: s, cancel: cancel, oneReply: !desc.ServerStreams}, nil
}

// boundStream releases its context once the stream is done: at its end
// or failure, or at the one reply of a stream that has one.
type boundStream struct {
	grpc.ClientStream
	cancel   context.CancelFunc
	oneReply bool
}

func (s *boundStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if err != nil || s.oneReply {
		s.cancel()
	}
	return err
}
