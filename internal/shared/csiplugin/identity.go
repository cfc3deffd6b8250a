// Package csiplugin is what the two CSI plugins share: the identity service,
// the serving plumbing (endpoint, logging interceptor, graceful stop,
// metrics) and the request checks both the controller and the node
// service make. The services themselves live in controller/csiserver
// (zfs-controller) and node/csiserver (zfs-node); each stays thin: validate the
// request, call the logic in plain Go types, map the result back and the
// error to the code the CSI spec prescribes (through package errdefs).
package csiplugin

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/version"
)

// Identity is the CSI Identity service of both binaries.
type Identity struct {
	csi.UnimplementedIdentityServer
	// probe says whether this process can do its job now.
	probe func(context.Context) error
}

// NewIdentity returns the Identity service; probe backs Probe.
func NewIdentity(probe func(context.Context) error) *Identity {
	return &Identity{probe: probe}
}

func (i *Identity) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: version.PluginName, VendorVersion: version.Version}, nil
}

// GetPluginCapabilities describes the plugin as a whole (controller and
// node binaries together), so both report the controller service: a CO such
// as csi-sanity asks the node endpoint whether a controller exists.
func (i *Identity) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	service := func(t csi.PluginCapability_Service_Type) *csi.PluginCapability {
		return &csi.PluginCapability{Type: &csi.PluginCapability_Service_{Service: &csi.PluginCapability_Service{Type: t}}}
	}
	return &csi.GetPluginCapabilitiesResponse{Capabilities: []*csi.PluginCapability{
		service(csi.PluginCapability_Service_CONTROLLER_SERVICE),
		service(csi.PluginCapability_Service_VOLUME_ACCESSIBILITY_CONSTRAINTS),
		{Type: &csi.PluginCapability_VolumeExpansion_{VolumeExpansion: &csi.PluginCapability_VolumeExpansion{
			Type: csi.PluginCapability_VolumeExpansion_ONLINE}}},
	}}, nil
}

// Probe answers ready only when the probe passes, and otherwise fails with
// FailedPrecondition and what is wrong, which Nomad shows as plugin health.
func (i *Identity) Probe(ctx context.Context, _ *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	if err := i.probe(ctx); err != nil {
		return nil, errdefs.Wrap(errdefs.ErrFailedPrecondition, "not ready: %v", err)
	}
	return &csi.ProbeResponse{Ready: wrapperspb.Bool(true)}, nil
}
