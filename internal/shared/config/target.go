package config

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/zfsname"
)

// Target is the configuration of a backup target, zfs-node target
// (docs/backups.md): a host with a ZFS pool, outside the cluster, that
// keeps the backups nodes push to it.
type Target struct {
	// Name is the target's name: its certificate's common name, and the
	// key the nodes' backup_targets give it. Required.
	Name string `json:"name"`
	// RootDataset holds every volume's backups, ROOT/<volume-id>. It must
	// exist. Required.
	RootDataset string `json:"root_dataset"`
	// Address is the host:port nodes push to.
	Address string `json:"address"`
	// MaxQuota is the largest volume whose backups the target takes: a
	// stream may carry at most its volume's capacity, and never more than
	// this. 0: no bound beyond the volume's own capacity.
	MaxQuota ByteSize `json:"max_quota"`
	// ReceiveIdleTimeout ends a receive whose sender sent nothing for that
	// long.
	ReceiveIdleTimeout Duration `json:"receive_idle_timeout"`
	// DefaultRetention prunes the backups of volumes whose
	// backup_retention names no grid, or one that keeps more than
	// MaxKept.
	DefaultRetention string `json:"default_retention"`
	// MaxKept bounds the backups a volume's own grid may keep.
	MaxKept int `json:"max_kept"`
	// TLS is the target's mutual TLS material: a certificate of role
	// backup (zfs-controller tls cert -role backup). Required.
	TLS TLSFiles `json:"tls"`
	// MetricsAddress serves Prometheus metrics at http://ADDRESS/metrics
	// ("" turns it off).
	MetricsAddress string `json:"metrics_address"`
}

// DefaultTarget returns the defaults a config file or flags override.
func DefaultTarget() Target {
	return Target{
		Address:            ":7680",
		ReceiveIdleTimeout: Duration(2 * time.Minute),
		DefaultRetention:   "1h:24,1d:14,1w:8,1m:12",
		MaxKept:            200,
		TLS:                TLSFiles{ExpiryWarning: DefaultExpiryWarning},
	}
}

// Validate checks the config and explains every problem at once. The
// retention grid's form is the target's to check (package retention).
func (c *Target) Validate() error {
	var errs []error
	if !contract.IsNodeID(c.Name) {
		errs = append(errs, fmt.Errorf("name %q: required; letters, digits, _ . - (at most 128), as its certificate's common name", c.Name))
	}
	if err := zfsname.Validate(c.RootDataset); err != nil || strings.Contains(c.RootDataset, "@") {
		errs = append(errs, fmt.Errorf("root_dataset %q: required, a filesystem such as backup/nomad", c.RootDataset))
	}
	if c.Address == "" {
		errs = append(errs, errors.New("address: required, the host:port nodes push backups to"))
	}
	if c.ReceiveIdleTimeout < Duration(time.Second) {
		errs = append(errs, fmt.Errorf("receive_idle_timeout %s: at least 1s", c.ReceiveIdleTimeout))
	}
	if c.MaxKept < 1 {
		errs = append(errs, fmt.Errorf("max_kept %d: at least 1", c.MaxKept))
	}
	if err := c.TLS.validate(false); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// validateTarget checks one of a node's backup_targets.
func validateTarget(name, addr string) error {
	if !contract.IsNodeID(name) {
		return fmt.Errorf("backup_targets: name %q: letters, digits, _ . - (at most 128), as the target's certificate's common name", name)
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return fmt.Errorf("backup_targets.%s: %q is not host:port: %v", name, addr, err)
	}
	return nil
}
