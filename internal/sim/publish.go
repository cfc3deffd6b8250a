package sim

import (
	"context"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/zfs-nomad/zfs-nomad/internal/errdefs"
)

// Publish calls ControllerPublishVolume as Nomad's claim does, retrying
// for up to within: a move's catch-up running in the background
// (FailedPrecondition saying so, which Nomad's claim retries with
// backoff) and the temporary codes. Other FailedPreconditions, which
// Nomad would retry too, are answered at once: a test that expects one
// sees it. each, when set, is told every answer retried.
func Publish(ctx context.Context, ctl csi.ControllerClient, req *csi.ControllerPublishVolumeRequest, within time.Duration, each func(error)) (*csi.ControllerPublishVolumeResponse, error) {
	deadline := time.Now().Add(within)
	for {
		resp, err := ctl.ControllerPublishVolume(ctx, req)
		if err == nil || !(CatchingUp(err) || errdefs.Temporary(err)) || time.Now().After(deadline) {
			return resp, err
		}
		if each != nil {
			each(err)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// CatchingUp reports whether err is a publish's answer that the move's
// target is being caught up in the background.
func CatchingUp(err error) bool {
	s := status.Convert(err)
	return s.Code() == codes.FailedPrecondition && strings.Contains(s.Message(), "in the background")
}
