package config

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// Controller is the configuration of zfs-controller.
type Controller struct {
	// CSIEndpoint is where the CSI Identity and Controller services listen.
	CSIEndpoint string `json:"csi_endpoint"`
	// Peers lists node agent addresses (host:port) for clusters without
	// service discovery. Ignored when PeersFile is set.
	Peers []string `json:"peers"`
	// PeersFile names a file with one agent address per line, re-read when
	// it changes. Under Nomad a template renders it from service discovery.
	PeersFile string `json:"peers_file"`
	// NomadService is the Nomad service the node agents register (the
	// node job's agent_service). Operator commands given neither Peers nor
	// PeersFile read the agents' addresses from it, through Nomad's API
	// (NOMAD_ADDR, NOMAD_TOKEN, ...); serve does not read it.
	NomadService string `json:"nomad_service"`
	// Placement is "most-free" (default: the matching node with the most
	// free space) or "fewest-volumes".
	Placement string `json:"placement"`
	// AgentTimeout bounds each call to a node agent.
	AgentTimeout Duration `json:"agent_timeout"`
	// ScheduleEvery is how often the replication schedule runs; 0 turns it
	// off (volumes then replicate only by operator command).
	ScheduleEvery Duration `json:"schedule_every"`
	// ParallelPushes bounds the transfers the schedule runs at once.
	ParallelPushes int `json:"parallel_pushes"`
	// MoveCatchUps bounds the catch-ups (a move's bulk push to a target
	// that is not fresh) running in the background, per source node;
	// moves in their final step are not counted (docs/migration.md,
	// "Catch-up").
	MoveCatchUps int `json:"move_catch_ups"`
	// MovePublishAhead grants a publish whose volume's background move
	// to the node is estimated to end within it, and the node's stage
	// waits for the move (docs/migration.md, "Publishing ahead of a
	// move's end"); 0 turns it off.
	MovePublishAhead Duration `json:"move_publish_ahead"`
	// FlushOnUnpublish pushes a volume unpublished from its primary's
	// node to each of its replicas at once (docs/migration.md, "Flush at
	// unpublish"): off by default, because a move that meets the flush
	// waits for it and takes longer than one alone.
	FlushOnUnpublish bool `json:"flush_on_unpublish"`
	// DeletionsEvery is how often the instance holding the work lease
	// deletes the copies of deleted snapshots that a node away at the
	// delete still holds, and the records once none is left
	// (docs/replication.md, "Deleted snapshots").
	DeletionsEvery Duration `json:"deletions_every"`
	// SurplusGrace is how long a copy a move demoted stays at least,
	// surplus or not (docs/replication.md, "Surplus copies").
	SurplusGrace Duration `json:"surplus_grace"`
	// BackupTargets are the backup targets (docs/backups.md), by name to
	// host:port, whose backups the controller lists and restores: the
	// nodes' backup_targets.
	BackupTargets map[string]string `json:"backup_targets"`
	// BackupsAsSnapshots lists the targets' backups as CSI snapshots and
	// restores them through CSI CreateVolume, for whoever may create
	// volumes (docs/backups.md, "Restores by job submitters"); off, only
	// an operator restores (zfs-controller restore).
	BackupsAsSnapshots bool `json:"backups_as_snapshots"`
	// TLS is the controller's mutual TLS material for the agent ports.
	TLS TLSFiles `json:"tls"`
	// InsecureAgentPort talks to agents without TLS: test networks only.
	InsecureAgentPort bool `json:"insecure_agent_port"`
	// MetricsAddress serves Prometheus metrics at http://ADDRESS/metrics
	// ("" turns it off).
	MetricsAddress string `json:"metrics_address"`
}

// maxMovePublishAhead bounds move_publish_ahead well within the time a
// CO gives the node's stage (Nomad: three tries of two minutes).
const maxMovePublishAhead = 3 * time.Minute

// DefaultController returns the defaults a config file or flags override.
func DefaultController() Controller {
	return Controller{
		CSIEndpoint:      "unix:///run/zfs-nomad/controller.sock",
		Placement:        "most-free",
		AgentTimeout:     Duration(30 * time.Second),
		NomadService:     "zfs-nomad-agent",
		ScheduleEvery:    Duration(30 * time.Second),
		ParallelPushes:   2,
		MoveCatchUps:     4,
		MovePublishAhead: Duration(2 * time.Minute),
		DeletionsEvery:   Duration(time.Minute),
		SurplusGrace:     Duration(10 * time.Minute),
		TLS:              TLSFiles{ExpiryWarning: DefaultExpiryWarning},
	}
}

// Validate checks the config and explains every problem at once.
func (c *Controller) Validate() error {
	var errs []error
	if c.PeersFile == "" && len(c.Peers) == 0 {
		errs = append(errs, errors.New("peers or peers_file: required, where the node agents are"))
	}
	return errors.Join(append(errs, c.validateSettings())...)
}

// validateOperator checks an operator command's config: without peers,
// the command finds the agents through Nomad (NomadService).
func (c *Controller) validateOperator() error {
	if c.PeersFile == "" && len(c.Peers) == 0 && c.NomadService == "" {
		return errors.New("peers, peers_file or nomad_service: required, where the node agents are")
	}
	return c.validateSettings()
}

// validateSettings checks everything but where the agents are.
func (c *Controller) validateSettings() error {
	var errs []error
	if c.CSIEndpoint == "" {
		errs = append(errs, errors.New("csi_endpoint: required (Nomad sets CSI_ENDPOINT)"))
	}
	for _, p := range c.Peers {
		if _, port, ok := strings.Cut(p, ":"); !ok || port == "" {
			errs = append(errs, fmt.Errorf("peers: %q is not host:port", p))
		}
	}
	if c.Placement != "most-free" && c.Placement != "fewest-volumes" {
		errs = append(errs, fmt.Errorf("placement %q: must be most-free or fewest-volumes", c.Placement))
	}
	if err := c.TLS.validate(c.InsecureAgentPort); err != nil {
		errs = append(errs, err)
	}
	for _, name := range slices.Sorted(maps.Keys(c.BackupTargets)) {
		if err := validateTarget(name, c.BackupTargets[name]); err != nil {
			errs = append(errs, err)
		}
	}
	if c.ScheduleEvery < 0 || c.ParallelPushes < 1 {
		errs = append(errs, fmt.Errorf("schedule_every %s must not be negative and parallel_pushes %d at least 1", c.ScheduleEvery, c.ParallelPushes))
	}
	if c.DeletionsEvery <= 0 {
		errs = append(errs, fmt.Errorf("deletions_every %s: must be positive", time.Duration(c.DeletionsEvery)))
	}
	if c.SurplusGrace < 0 {
		errs = append(errs, fmt.Errorf("surplus_grace %s: must not be negative", time.Duration(c.SurplusGrace)))
	}
	if c.MoveCatchUps < 1 {
		errs = append(errs, fmt.Errorf("move_catch_ups %d: must be at least 1", c.MoveCatchUps))
	}
	if c.MovePublishAhead < 0 || time.Duration(c.MovePublishAhead) > maxMovePublishAhead {
		errs = append(errs, fmt.Errorf("move_publish_ahead %s: must be 0 (off) to %s: the node's stage waits that long for the move, and Nomad gives a stage three tries of two minutes", time.Duration(c.MovePublishAhead), maxMovePublishAhead))
	}
	if c.AgentTimeout <= 0 {
		errs = append(errs, fmt.Errorf("agent_timeout %s: must be positive", time.Duration(c.AgentTimeout)))
	}
	return errors.Join(errs...)
}

// Duration is a time.Duration that reads "30s" in JSON.
type Duration time.Duration

func (d *Duration) UnmarshalJSON(data []byte) error {
	s := strings.Trim(string(data), `"`)
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("duration %s: %w", data, err)
	}
	*d = Duration(v)
	return nil
}

func (d Duration) String() string { return time.Duration(d).String() }

func (d *Duration) Set(s string) error {
	v, err := time.ParseDuration(s)
	*d = Duration(v)
	return err
}
