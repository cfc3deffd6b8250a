package volume

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/node/retention"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/config"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// controllerParameters are volume parameters that steer the controller and
// set no ZFS property.
var controllerParameters = map[string]bool{contract.ParamNode: true, contract.ParamReplicas: true, contract.ParamReplicationInterval: true, contract.ParamPinned: true, contract.ParamFailover: true,
	contract.ParamBackupTo: true, contract.ParamBackupEvery: true, contract.ParamBackupRetention: true}

// checkControllerParameter checks a controller parameter's value against
// the operator's limits.
func checkControllerParameter(cfg *config.Node, key, value string) error {
	switch key {
	case contract.ParamReplicas:
		n, err := strconv.Atoi(value)
		if err != nil || n < 0 || n > cfg.MaxReplicas {
			return fmt.Errorf("%w: parameter %q=%q: want a whole number from 0 to %d (the operator's max_replicas)", errdefs.ErrInvalidArgument, key, value, cfg.MaxReplicas)
		}
	case contract.ParamPinned:
		if value != "true" && value != "false" {
			return fmt.Errorf("%w: parameter %q=%q: want true or false", errdefs.ErrInvalidArgument, key, value)
		}
	case contract.ParamFailover:
		if value != contract.FailoverAuto && value != contract.FailoverManual {
			return fmt.Errorf("%w: parameter %q=%q: want %q or %q", errdefs.ErrInvalidArgument, key, value, contract.FailoverAuto, contract.FailoverManual)
		}
	case contract.ParamBackupTo:
		for _, t := range strings.Split(value, ",") {
			if _, ok := cfg.BackupTargets[strings.TrimSpace(t)]; !ok {
				return fmt.Errorf("%w: parameter %q=%q: %q is not a backup target of this node (its operator's backup_targets: %s)",
					errdefs.ErrInvalidArgument, key, value, strings.TrimSpace(t), strings.Join(slices.Sorted(maps.Keys(cfg.BackupTargets)), ", "))
			}
		}
	case contract.ParamBackupEvery:
		d, err := time.ParseDuration(value)
		if err != nil || d < time.Duration(cfg.MinBackupInterval) {
			return fmt.Errorf("%w: parameter %q=%q: want a duration of at least %s (the operator's min_backup_interval)", errdefs.ErrInvalidArgument, key, value, cfg.MinBackupInterval)
		}
	case contract.ParamBackupRetention:
		// The targets prune by it, each within its own max_kept.
		if _, err := retention.Parse(value); err != nil {
			return fmt.Errorf("%w: parameter %q: %v", errdefs.ErrInvalidArgument, key, err)
		}
	case contract.ParamReplicationInterval:
		d, err := time.ParseDuration(value)
		if err != nil || d < time.Duration(cfg.MinReplicationInterval) {
			return fmt.Errorf("%w: parameter %q=%q: want a duration of at least %s (the operator's min_replication_interval)", errdefs.ErrInvalidArgument, key, value, cfg.MinReplicationInterval)
		}
	}
	return nil
}

// createOnlyProperties are set when a filesystem is created and are
// read-only after: a promotion, which sets the others again on the
// received copy, leaves them alone (the stream brought them).
var createOnlyProperties = map[string]bool{"encryption": true, "normalization": true, "casesensitivity": true, "utf8only": true}

// ignoredParameterPrefixes are added by Kubernetes sidecars, not submitters.
var ignoredParameterPrefixes = []string{"csi.storage.k8s.io/"}

// Spec is what a validated create request asks ZFS for.
type Spec struct {
	Quota uint64
	// Properties are the ZFS properties to set: operator defaults overlaid
	// with what the parameters asked for, all within the operator's rules.
	Properties map[string]string
	// Parameters are the submitter's parameters as stored on the dataset.
	Parameters map[string]string
}

// ResolveQuota turns a CSI capacity range into a quota within the operator's
// bounds. required and limit are 0 when unset.
func ResolveQuota(cfg *config.Node, required, limit uint64) (uint64, error) {
	max := uint64(cfg.MaxQuota)
	if limit > 0 && required > limit {
		return 0, fmt.Errorf("%w: required capacity %d is above the limit %d", errdefs.ErrInvalidArgument, required, limit)
	}
	quota := required
	if quota == 0 {
		quota = uint64(cfg.DefaultQuota)
		if limit > 0 && quota > limit {
			quota = limit
		}
	}
	if quota > max {
		return 0, fmt.Errorf("%w: capacity %s is above this node's maximum volume size %s; ask for less or have the operator raise max_quota",
			errdefs.ErrOutOfRange, config.ByteSize(quota), cfg.MaxQuota)
	}
	return quota, nil
}

// ResolveProperties checks parameters against the operator's allowlist and
// returns the ZFS properties to set and the parameters to record.
func ResolveProperties(cfg *config.Node, params map[string]string) (props, recorded map[string]string, err error) {
	props = map[string]string{}
	recorded = map[string]string{}
	for name, rule := range cfg.Properties {
		if rule.Default != "" {
			props[name] = rule.Default
		}
	}
	for _, key := range slices.Sorted(maps.Keys(params)) {
		value := params[key]
		if ignoredParameter(key) {
			continue
		}
		recorded[key] = value
		if key == contract.ParamOwnerDigest {
			// The controller's, from the create's owner secret
			// (contract.OwnedParameters); never a ZFS property.
			if !contract.IsOwnerDigest(value) {
				return nil, nil, fmt.Errorf("%w: parameter %q is the driver's own; give the volume's owner as a secret instead: secrets { %s = \"...\" }", errdefs.ErrInvalidArgument, key, contract.SecretOwner)
			}
			continue
		}
		if controllerParameters[key] {
			if err := checkControllerParameter(cfg, key, value); err != nil {
				return nil, nil, err
			}
			continue
		}
		if rootParameters[key] {
			continue // ResolveRoot checks them
		}
		rule, ok := cfg.Properties[key]
		if !ok {
			return nil, nil, fmt.Errorf("%w: parameter %q is not allowed; allowed are %s", errdefs.ErrInvalidArgument, key, allowedParameters(cfg))
		}
		if err := config.ValidatePropertyValue(value); err != nil {
			return nil, nil, fmt.Errorf("%w: parameter %q: %v", errdefs.ErrInvalidArgument, key, err)
		}
		if len(rule.Allowed) > 0 && !slices.Contains(rule.Allowed, value) {
			return nil, nil, fmt.Errorf("%w: parameter %q=%q is not allowed; the operator allows %s", errdefs.ErrInvalidArgument, key, value, strings.Join(rule.Allowed, ", "))
		}
		props[key] = value
	}
	if _, ok := params[contract.ParamBackupEvery]; ok && params[contract.ParamBackupTo] == "" {
		return nil, nil, fmt.Errorf("%w: parameter %q without %q: name the backup targets the volume is backed up to", errdefs.ErrInvalidArgument, contract.ParamBackupEvery, contract.ParamBackupTo)
	}
	return props, recorded, nil
}

func allowedParameters(cfg *config.Node) string {
	var keys []string
	for k := range cfg.Properties {
		keys = append(keys, k)
	}
	for k := range controllerParameters {
		keys = append(keys, k)
	}
	for k := range rootParameters {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return strings.Join(keys, ", ")
}

func ignoredParameter(key string) bool {
	for _, p := range ignoredParameterPrefixes {
		if strings.HasPrefix(key, p) {
			return true
		}
	}
	return false
}
