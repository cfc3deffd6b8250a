package contract

import (
	"strconv"
	"strings"
	"time"
)

// ParamNode pins a new volume to a node; the controller reads it for
// placement and nodes ignore it. It is how csi-sanity, which sends no
// topology, places its volumes.
const ParamNode = "node"

// Replication parameters: how many peers hold a copy, and how often it is
// brought up to date (a Go duration such as "5m"). The node checks them
// against its operator's limits; the controller's scheduler acts on them.
const (
	ParamReplicas            = "replicas"
	ParamReplicationInterval = "replication_interval"
)

// Backup parameters (docs/backups.md): the backup targets a volume is
// backed up to (comma-separated names from the operator's
// backup_targets), how often (a Go duration), and the retention grid the
// targets prune its backups by ("1h:24,1d:14,1w:8,1m:12"). The node
// checks them against its operator's bounds at create; the controller's
// backup schedule acts on the first two.
const (
	ParamBackupTo        = "backup_to"
	ParamBackupEvery     = "backup_every"
	ParamBackupRetention = "backup_retention"
)

// DefaultBackupInterval applies when a volume names backup targets but
// no interval.
const DefaultBackupInterval = 24 * time.Hour

// BackupPolicy reads a volume's backup parameters; they were checked
// when it was created. No targets: the schedule backs it up nowhere.
func BackupPolicy(params map[string]string) (targets []string, every time.Duration) {
	for _, t := range strings.Split(params[ParamBackupTo], ",") {
		if t = strings.TrimSpace(t); t != "" {
			targets = append(targets, t)
		}
	}
	every, err := time.ParseDuration(params[ParamBackupEvery])
	if err != nil || every <= 0 {
		every = DefaultBackupInterval
	}
	return targets, every
}

// Migration parameters (docs/migration.md): "pinned"="true" keeps a volume
// on its node; "failover" is "manual" (default: an operator promotes a
// replica when the primary's node is lost) or "auto".
const (
	ParamPinned   = "pinned"
	ParamFailover = "failover"
)

// Failover policies.
const (
	FailoverManual = "manual"
	FailoverAuto   = "auto"
)

// Pinned reports whether a volume stays on its node.
func Pinned(params map[string]string) bool { return params[ParamPinned] == "true" }

// FailoverPolicy returns a volume's failover policy.
func FailoverPolicy(params map[string]string) string {
	if params[ParamFailover] == FailoverAuto {
		return FailoverAuto
	}
	return FailoverManual
}

// ReplicationPolicy reads a volume's replication parameters; they were
// checked when it was created.
func ReplicationPolicy(params map[string]string) (replicas int, interval time.Duration) {
	replicas, _ = strconv.Atoi(params[ParamReplicas])
	interval, _ = time.ParseDuration(params[ParamReplicationInterval])
	if replicas > 0 && interval <= 0 {
		interval = DefaultReplicationInterval
	}
	return replicas, interval
}

// DefaultReplicationInterval applies when a volume asks for replicas but
// names no interval.
const DefaultReplicationInterval = 5 * time.Minute

// PublishContextGeneration is the publish context key that carries the
// generation ControllerPublishVolume made current; a node refuses to stage
// any other (docs/migration.md).
const PublishContextGeneration = "generation"

// PublishContextAfterGeneration is the publish context key of a publish
// granted ahead of the end of the volume's move to the node: the node
// waits, when staging, until its copy is the primary of a generation
// newer than this one, the move's source's (docs/migration.md).
const PublishContextAfterGeneration = "after_generation"

// Root directory parameters: the owner, group and octal mode a new volume's
// root directory gets, within the operator's root_directory rules; the
// default is root, root, 0755 (docs/volumes.md, "Owner and mode").
const (
	ParamUID  = "uid"
	ParamGID  = "gid"
	ParamMode = "mode"
)
