// Package connpool keeps one gRPC client connection per peer address.
// The controller's calls to the node agents and a node's pushes to its
// peers each share a connection per peer: a TLS handshake per call would
// add its round trips and CPU to every call and every move.
package connpool

import (
	"context"
	"fmt"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
)

// Pool holds the connections, made by dial the first time an address is
// asked for and kept until Close.
type Pool struct {
	dial func(addr string) (*grpc.ClientConn, error)

	mu    sync.Mutex
	conns map[string]*grpc.ClientConn
}

// New returns an empty pool that dials with dial; with a nil dial it
// dials nothing (a cluster of in-memory fakes keeps one for Close).
func New(dial func(addr string) (*grpc.ClientConn, error)) *Pool {
	return &Pool{dial: dial, conns: map[string]*grpc.ClientConn{}}
}

// Get returns the connection to addr, dialling it the first time.
func (p *Pool) Get(addr string) (*grpc.ClientConn, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if conn, ok := p.conns[addr]; ok {
		return conn, nil
	}
	if p.dial == nil {
		return nil, fmt.Errorf("connect to %s: this pool dials nothing", addr)
	}
	conn, err := p.dial(addr)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", addr, err)
	}
	p.conns[addr] = conn
	return conn, nil
}

// ResetBackoff makes addr's connection dial again at once if it waits out
// a backoff after failed attempts (TransientFailure): after failures gRPC
// waits up to two minutes before dialling again, and a peer that is back
// must be reached now. In any other state a call dials, or is dialling,
// without waiting. The state check also keeps ResetConnectBackoff safe:
// gRPC (v1.85) iterates the connection's subchannels without its lock
// there, racing with a connection that leaves idleness and creates them
// (the runtime's fatal "concurrent map iteration and map write" would end
// the process: grpc-go pull request 9155); a connection in
// TransientFailure creates none.
//
// It is not part of Get: a call that does not wait for readiness fails at
// once while the connection is in TransientFailure, but waits while it
// connects, so resetting on every call would make every call to a dead
// peer wait for a connection attempt.
func (p *Pool) ResetBackoff(addr string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if conn, ok := p.conns[addr]; ok && conn.GetState() == connectivity.TransientFailure {
		conn.ResetConnectBackoff()
	}
}

// Holds reports whether the pool has a connection to addr.
func (p *Pool) Holds(addr string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.conns[addr]
	return ok
}

// AwaitReady dials addr's connection again at once if it waits out a
// backoff (as ResetBackoff does), then waits until the connection is
// ready or ctx ends, and reports whether it is ready. It dials at most
// once a call: a caller that polls a dead peer paces the attempts.
func (p *Pool) AwaitReady(ctx context.Context, addr string) bool {
	p.mu.Lock()
	conn, ok := p.conns[addr]
	p.mu.Unlock()
	if !ok {
		return false
	}
	p.ResetBackoff(addr)
	for {
		state := conn.GetState()
		switch state {
		case connectivity.Ready:
			return true
		case connectivity.Shutdown:
			return false
		case connectivity.Idle:
			conn.Connect()
		}
		if !conn.WaitForStateChange(ctx, state) {
			return false
		}
	}
}

// Close closes every connection.
func (p *Pool) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for addr, conn := range p.conns {
		_ = conn.Close()
		delete(p.conns, addr)
	}
}
