package replication

import "google.golang.org/grpc"

// Bulk data flows through gRPC streams of chunkSize messages. gRPC's
// default flow-control windows (64 KiB, grown by BDP estimation) and 32 KiB
// buffers keep a fast stream waiting on window updates; large fixed windows
// let the sender keep several chunks in flight (see docs/replication.md for
// the measurements).
const (
	streamWindow = 16 << 20
	connWindow   = 32 << 20
	bufferSize   = 1 << 20
)

// ServerOptions tune the agent port's gRPC server for bulk streams.
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.InitialWindowSize(streamWindow),
		grpc.InitialConnWindowSize(connWindow),
		grpc.ReadBufferSize(bufferSize),
		grpc.WriteBufferSize(bufferSize),
	}
}

// DialOptions tune connections to peers for bulk streams.
func DialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithInitialWindowSize(streamWindow),
		grpc.WithInitialConnWindowSize(connWindow),
		grpc.WithReadBufferSize(bufferSize),
		grpc.WithWriteBufferSize(bufferSize),
	}
}
