package guestcluster

import (
	"fmt"
	"path/filepath"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/tlsconfig"
)

// Target is a backup target beside the cluster (zfs-node target,
// docs/backups.md): a pool of its own, a network namespace of its own on
// the cluster's bridge, a certificate of role backup, and no Nomad, CSI
// socket or peers. Every node knows it by Name (backup_targets).
type Target struct {
	Name        string
	Pool        string
	RootDataset string
	IP          string
	Address     string
	TLS         tlsconfig.Files
	Process     *Process
	host        *Process
	args        []string
	c           *Cluster
}

// targetIndex numbers the target's veth pair apart from the nodes'.
const targetIndex = 50

// TargetAddress is where the nodes reach the cluster's target.
func TargetAddress() string { return fmt.Sprintf("10.77.0.%d:7680", targetIndex) }

// setUpTarget makes the backup target opts.BackupTarget on
// opts.BackupTargetDisk and starts it.
func (c *Cluster) setUpTarget() error {
	t := &Target{Name: c.opts.BackupTarget, Pool: c.opts.BackupTarget, IP: fmt.Sprintf("10.77.0.%d", targetIndex), Address: TargetAddress(), c: c}
	t.RootDataset = t.Pool + "/backups"
	if err := CreatePool(t.Pool, c.opts.BackupTargetDisk); err != nil {
		return err
	}
	c.undo = append(c.undo, func() { DestroyPool(t.Pool) })
	if _, err := Run("zfs", "create", t.RootDataset); err != nil {
		return err
	}
	c.undo = append(c.undo, func() { tearDownNetwork(t.Name, hostLink(targetIndex)) })
	if err := setUpNetwork(t.Name, hostLink(targetIndex), t.IP); err != nil {
		return err
	}
	var err error
	if t.TLS, err = c.CA.Issue(t.Name, tlsconfig.RoleBackup); err != nil {
		return err
	}
	t.args = append([]string{"target", "-name", t.Name, "-root-dataset", t.RootDataset, "-address", t.Address, "-max-quota", "10G"}, tlsArgs(t.TLS)...)
	c.Target = t
	c.undo = append(c.undo, t.stop)
	return t.Start()
}

// Start starts (or restarts) the target's zfs-node target in its
// namespaces and waits for its port.
func (t *Target) Start() error {
	if t.host == nil {
		host, err := t.c.start(t.Name+"-host", "ip", "netns", "exec", t.Name, "sleep", "1000000000")
		if err != nil {
			return err
		}
		t.host = host
		if err := waitForOwnNamespaces(host.Pid()); err != nil {
			return err
		}
	}
	args := append([]string{"-t", fmt.Sprint(t.host.Pid()), "-m", "-n", "--", filepath.Join(t.c.opts.BinDir, "zfs-node")}, t.args...)
	p, err := t.c.start(t.Name, "nsenter", args...)
	if err != nil {
		return err
	}
	t.Process = p
	return waitForListener(t.host.Pid(), t.Address, t.Process)
}

// stop stops the target's processes.
func (t *Target) stop() {
	if t.Process != nil {
		t.Process.Stop()
	}
	if t.host != nil {
		t.host.Kill()
	}
}
