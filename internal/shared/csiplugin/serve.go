package csiplugin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/logqueue"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/metrics"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/volumelog"
)

// Listen opens a CSI endpoint: unix:///path/csi.sock (a stale socket file
// from an earlier run is removed) or tcp://host:port.
func Listen(endpoint string) (net.Listener, error) {
	u, err := url.Parse(endpoint)
	if err != nil {
		return nil, fmt.Errorf("endpoint %q: %w", endpoint, err)
	}
	switch u.Scheme {
	case "unix":
		path := u.Path
		if path == "" {
			path = u.Opaque
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
			return nil, fmt.Errorf("endpoint %s: %w", endpoint, err)
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("removing stale socket %s: %w", path, err)
		}
		return net.Listen("unix", path)
	case "tcp":
		return net.Listen("tcp", u.Host)
	}
	return nil, fmt.Errorf("endpoint %q: want unix:///path or tcp://host:port", endpoint)
}

// LoggingInterceptor turns a handler's error into its gRPC status
// (errdefs.ToStatus: the one conversion at the boundary of the CSI
// services and the node agent) and logs every call with its outcome, and
// the volume or snapshot ID when the request names one.
func LoggingInterceptor(log hclog.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		start := time.Now()
		resp, err := handler(ctx, req)
		err = errdefs.ToStatus(err)
		fields := []any{"method", info.FullMethod, "duration", time.Since(start).Round(time.Microsecond)}
		if r, ok := req.(interface{ GetVolumeId() string }); ok && r.GetVolumeId() != "" {
			fields = append(fields, "volume_id", r.GetVolumeId())
		}
		if r, ok := req.(interface{ GetSnapshotId() string }); ok && r.GetSnapshotId() != "" {
			fields = append(fields, "snapshot_id", r.GetSnapshotId())
		}
		if err != nil {
			fields = append(fields, "code", status.Code(err), "error", err)
			if status.Code(err) == codes.Internal {
				log.Error("call failed", fields...)
			} else {
				log.Info("call refused", fields...)
			}
			return resp, err
		}
		quiet := strings.HasSuffix(info.FullMethod, "/Probe") || strings.HasSuffix(info.FullMethod, "/GetNode") ||
			strings.Contains(info.FullMethod, "GetCapabilities") || strings.HasSuffix(info.FullMethod, "/GetPluginInfo")
		if quiet {
			log.Trace("call", fields...)
		} else {
			log.Debug("call", fields...)
		}
		return resp, nil
	}
}

// callBuckets are the upper bounds of a call's duration, in seconds:
// from a status read (milliseconds) to a stage that waits for a move's
// promotion (up to two minutes).
var callBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}

// CallMetrics counts and times every unary call, by method (its short
// name) and gRPC code, in the histogram name of registry. Chained before
// LoggingInterceptor (outside it), it sees the status that one made.
func CallMetrics(registry *metrics.Registry, name, help string) grpc.UnaryServerInterceptor {
	calls := registry.Histogram(name, help, callBuckets, "method", "code")
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		start := time.Now()
		resp, err := handler(ctx, req)
		calls.Observe(time.Since(start).Seconds(), info.FullMethod[strings.LastIndexByte(info.FullMethod, '/')+1:], status.Code(err).String())
		return resp, err
	}
}

// NewLogger returns the binaries' logger on stderr: level from
// ZFS_NOMAD_LOG_LEVEL (default info), JSON when ZFS_NOMAD_LOG_JSON is
// set. A command's log; a serving process takes NewServerLogger's.
func NewLogger(name string, getenv func(string) string) hclog.Logger {
	return newLogger(name, getenv, os.Stderr)
}

// NewServerLogger is NewLogger for a process that serves: its lines go
// to stderr through a logqueue.Writer, so that no call, beat or fence
// waits for the CO's log collector to read them. flush, at exit, waits a
// second at most for the lines still queued.
func NewServerLogger(name string, getenv func(string) string) (log hclog.Logger, flush func()) {
	w := logqueue.New(os.Stderr, logqueue.DefaultLines)
	log = newLogger(name, getenv, w)
	w.Start(func(dropped int64) {
		log.Warn("log lines were dropped here: the log's reader (the CO's log collector) did not read for a while", "dropped", dropped)
	})
	return log, func() { w.Flush(time.Second) }
}

func newLogger(name string, getenv func(string) string, out io.Writer) hclog.Logger {
	level := hclog.LevelFromString(getenv("ZFS_NOMAD_LOG_LEVEL"))
	if level == hclog.NoLevel {
		level = hclog.Info
	}
	return volumelog.Logger(hclog.New(&hclog.LoggerOptions{
		Name:       name,
		Level:      level,
		JSONFormat: getenv("ZFS_NOMAD_LOG_JSON") != "",
		Output:     out,
	}))
}

// Serve runs srv on lis until ctx ends, then stops it gracefully, waiting
// at most grace for calls in flight.
func Serve(ctx context.Context, srv *grpc.Server, lis net.Listener, grace time.Duration) error {
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(lis) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	stopped := make(chan struct{})
	go func() { srv.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(grace):
		srv.Stop()
	}
	return nil
}

// ListenMetrics opens the metrics address; "" opens nothing. Binaries
// call it at start, so a bad address fails the start, not later.
func ListenMetrics(addr string) (net.Listener, error) {
	if addr == "" {
		return nil, nil
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics address %s: %w", addr, err)
	}
	return lis, nil
}

// ServeMetrics serves the registry at /metrics on lis until ctx ends, and
// each of more at its path; a nil lis serves nothing.
func ServeMetrics(ctx context.Context, lis net.Listener, r *metrics.Registry, log hclog.Logger, more map[string]http.Handler) error {
	if lis == nil {
		return nil
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", r.Handler())
	for path, h := range more {
		mux.Handle(path, h)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	log.Info("serving metrics", "address", lis.Addr().String())
	if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
