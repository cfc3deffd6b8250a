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
// opts.BackupTargetDisk, with a certificate of the cluster's CA, and
// starts it.
func (c *Cluster) setUpTarget() error {
	files, err := c.CA.Issue(c.opts.BackupTarget, tlsconfig.RoleBackup)
	if err != nil {
		return err
	}
	_, err = c.StartTarget(c.opts.BackupTarget, c.opts.BackupTargetDisk, files)
	return err
}

// StartTarget makes a backup target named name, its pool on disk, with
// the certificate files (role backup, common name name: a cluster whose
// nodes trust another CA than the cluster's issues its own), starts it
// at TargetAddress and makes it the cluster's Target. The cluster's
// Close undoes it.
func (c *Cluster) StartTarget(name, disk string, files tlsconfig.Files) (*Target, error) {
	t := &Target{Name: name, Pool: name, IP: fmt.Sprintf("10.77.0.%d", targetIndex), Address: TargetAddress(), TLS: files, c: c}
	t.RootDataset = t.Pool + "/backups"
	if err := CreatePool(t.Pool, disk); err != nil {
		return nil, err
	}
	c.undo = append(c.undo, func() { DestroyPool(t.Pool) })
	if _, err := Run("zfs", "create", t.RootDataset); err != nil {
		return nil, err
	}
	c.undo = append(c.undo, func() { tearDownNetwork(t.Name, c.hostLink(targetIndex)) })
	if err := setUpNetwork(t.Name, c.hostLink(targetIndex), t.IP, c.opts.bridge()); err != nil {
		return nil, err
	}
	t.args = append([]string{"target", "-name", t.Name, "-root-dataset", t.RootDataset, "-address", t.Address, "-max-quota", "10G"}, tlsArgs(t.TLS)...)
	c.Target = t
	c.undo = append(c.undo, t.stop)
	return t, t.Start()
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
