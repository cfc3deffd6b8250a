package guestcluster

import (
	"context"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Publish calls ControllerPublishVolume as Nomad's claim does: again,
// every second for up to within, while retry (told each failed answer)
// says so; CatchingUp is what Nomad's claim waits out during a move.
func Publish(ctx context.Context, ctl csi.ControllerClient, req *csi.ControllerPublishVolumeRequest, within time.Duration, retry func(error) bool) (*csi.ControllerPublishVolumeResponse, error) {
	deadline := time.Now().Add(within)
	for {
		resp, err := ctl.ControllerPublishVolume(ctx, req)
		if err == nil || time.Now().After(deadline) || !retry(err) {
			return resp, err
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

// MountWriter is the capability the tests and the demo publish with: a
// file system that one node writes.
func MountWriter() *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
}
