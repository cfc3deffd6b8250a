// Package guestcluster runs a cluster of real zfs-node processes inside one ZFS guest (or on one ZFS
// host): several nodes, each with its own pool on its own disk, its own
// network namespace and IP on a bridge, its own mount namespace (which
// `ip netns exec` gives it) and its own zfs-node; a zfs-controller in the
// root namespace reaches the nodes' agents over the bridge.
//
//	root namespace: zfs-controller, bridge zbr0 10.77.0.254
//	  ├─ veth vh1 ── netns n1: eth0 10.77.0.1, zfs-node, pool1/nomad on /dev/vda
//	  ├─ veth vh2 ── netns n2: eth0 10.77.0.2, zfs-node, pool2/nomad on /dev/vdb
//	  └─ ...
//
// Clusters in different slots (Options.Slot) run side by side in one
// guest: slot s has its own bridge zbr<s> and subnet 10.77.<s>.0/24, its
// namespaces, links and pools are suffixed s<s> (n1s1, vh1s1, pool1s1),
// and its controller's metrics port is 9671+10s. Its nodes keep the IDs
// n1, n2, ...: node IDs are per cluster.
//
// Tests use it through package guesttest; the demo uses it directly.
package guestcluster

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"

	"github.com/zfs-nomad/zfs-nomad/internal/node/copyrecord"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/protocol"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/tlsconfig"
)

// EnvDisks lists the disks (devices or image files) tests may use,
// comma-separated. Unset in the guest, where the disks are /dev/vd*.
const EnvDisks = "ZFS_NOMAD_TEST_DISKS"

// Disk returns the i-th test disk: the i-th entry of ZFS_NOMAD_TEST_DISKS if
// set (guesttest sets it to image files on a host with ZFS, so tests never
// touch a real device there), else the guest's /dev/vda, /dev/vdb, ...
func Disk(i int) string {
	if list := os.Getenv(EnvDisks); list != "" {
		if disks := strings.Split(list, ","); i < len(disks) {
			return disks[i]
		}
	}
	return "/dev/vd" + string(rune('a'+i))
}

// Run runs a command and returns its output, with the output in the error.
func Run(name string, args ...string) (string, error) {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// RunWithInput runs a command with input on its standard input, as Run.
// Commands that take a batch on standard input (ip -batch -) spare the
// process spawns that cost most of a cluster's start under emulation.
func RunWithInput(input, name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.Stdin = strings.NewReader(input)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s <<%q: %w\n%s", name, strings.Join(args, " "), input, err, out)
	}
	return string(out), nil
}

// DatasetsLeft lists what a node holds under its root dataset besides the
// root and its promise records (copyrecord.PromisesDataset, which outlive
// every volume): the datasets and snapshots of volumes, replicas and
// copies set aside. Empty once every volume is deleted.
func DatasetsLeft(root string) ([]string, error) {
	out, err := Run("zfs", "list", "-H", "-r", "-t", "all", "-o", "name", root)
	if err != nil {
		return nil, err
	}
	promises := root + "/" + copyrecord.PromisesDataset
	var left []string
	for _, name := range strings.Fields(out) {
		if name != root && name != promises && !strings.HasPrefix(name, promises+"/") {
			left = append(left, name)
		}
	}
	return left, nil
}

// CreatePool creates pool name on disk, a device or an image file. A device
// is partitioned first: whole-disk vdevs wait for udev, which the guest
// does not run.
func CreatePool(name, disk string) error {
	vdev := disk
	if strings.HasPrefix(disk, "/dev/") {
		if _, err := RunWithInput(",,\n", "sfdisk", "-q", "--wipe", "always", disk); err != nil {
			return err
		}
		vdev = disk + "1"
	}
	_, err := Run("zpool", "create", "-f", "-O", "mountpoint=none", name, vdev)
	return err
}

// DestroyPool destroys a pool, ignoring one that is gone. A pool still
// busy (a process of the cluster just killed, a mount on its way out) is
// tried again for a while, and one that stays is reported on standard
// error: the next test's CreatePool would otherwise fail without saying
// why.
func DestroyPool(name string) {
	var out []byte
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		var err error
		out, err = exec.Command("zpool", "destroy", "-f", name).CombinedOutput()
		if err == nil || strings.Contains(string(out), "no such pool") {
			return
		}
		if time.Now().After(deadline) {
			break
		}
	}
	fmt.Fprintf(os.Stderr, "guestcluster: pool %s could not be destroyed for 10 s: %s\n", name, strings.TrimSpace(string(out)))
}

// Options shape a cluster.
type Options struct {
	// Nodes is the number of nodes; node i uses disk i-1.
	Nodes int
	// BinDir holds zfs-node and zfs-controller.
	BinDir string
	// Dir holds sockets, logs and each node's directory.
	Dir string
	// NodeArgs are extra zfs-node flags for every node.
	NodeArgs []string
	// Lease, when set, gives every node the others as peers and this
	// lease time (docs/safety.md, "Leases"); without it nodes have no
	// peers and never fence themselves.
	Lease time.Duration
	// Witnesses, with Lease, numbers the nodes (1 for n1) of the witness set
	// every node is given (docs/safety.md, "Witnesses").
	Witnesses []int
	// ControllerArgs are extra zfs-controller flags.
	ControllerArgs []string
	// NoController leaves the controller out.
	NoController bool
	// NoNodeProcesses sets the nodes up (pool, namespaces, certificates)
	// without starting zfs-node: something else runs it there (the Nomad
	// end-to-end test runs Nomad clients that run it as a plugin job).
	NoNodeProcesses bool
	// LogLevel of the binaries (default debug).
	LogLevel string
	// EncryptedRoots creates every node's root dataset encrypted (key in
	// KeyFile), so every volume inherits encryption.
	EncryptedRoots bool
	// BackupTarget, when set, names a backup target (Target) the cluster
	// starts before its nodes, with its pool on BackupTargetDisk; every
	// node and the controller know it by that name.
	BackupTarget     string
	BackupTargetDisk string
	// Slot places the cluster in a guest beside clusters of other slots
	// (the package comment); 0 is the default.
	Slot int
	// FirstDisk is the index of node 1's disk (Disk); node i uses disk
	// FirstDisk+i-1.
	FirstDisk int
}

// slotName is a namespace, link or pool name in o's slot: the name as
// it is in slot 0, suffixed s<slot> in the others.
func (o Options) slotName(name string) string {
	if o.Slot == 0 {
		return name
	}
	return fmt.Sprintf("%ss%d", name, o.Slot)
}

// ip is host i's address in o's slot's subnet (254: the bridge's).
func (o Options) ip(i int) string { return fmt.Sprintf("10.77.%d.%d", o.Slot, i) }

// bridge is the root namespace's bridge of o's slot.
func (o Options) bridge() string { return "zbr" + strconv.Itoa(o.Slot) }

// controllerMetrics is controller instance n's (1, 2, ...) metrics
// address in o's slot.
func (o Options) controllerMetrics(n int) string {
	return fmt.Sprintf("127.0.0.1:%d", 9671+10*o.Slot+n-1)
}

// KeyFile returns the raw key of encrypted roots in a cluster's dir.
func KeyFile(dir string) string { return filepath.Join(dir, "zfs.key") }

// Cluster is a running simulated cluster. Close undoes it.
type Cluster struct {
	opts       Options
	Nodes      []*Node
	Controller *Process
	// ControllerInstances are the instances StartControllerInstance
	// started beside Controller.
	ControllerInstances []*Process
	// ControllerEndpoint is the controller's CSI endpoint (unix://...).
	ControllerEndpoint string
	// ControllerMetrics is the controller's Prometheus endpoint.
	ControllerMetrics string
	// CA is the cluster's throw-away CA; Operator holds an operator
	// certificate from it, for calls to the agents (DialAgent).
	CA       *tlsconfig.CA
	Operator tlsconfig.Files
	// Target is the backup target of Options.BackupTarget, if any.
	Target *Target
	undo   []func()

	controllerArgs []string
}

// Dir is the cluster's directory (sockets, logs, keys).
func (c *Cluster) Dir() string { return c.opts.Dir }

// AgentAddresses returns the nodes' agent addresses, in the order of
// Nodes: the peer list of the controller and of the operator's commands.
func (c *Cluster) AgentAddresses() []string {
	var out []string
	for _, n := range c.Nodes {
		out = append(out, n.AgentAddress)
	}
	return out
}

// DialAgent connects to a node agent with the operator's certificate.
func (c *Cluster) DialAgent(addr string) (*grpc.ClientConn, error) {
	m, err := tlsconfig.Load(c.Operator)
	if err != nil {
		return nil, err
	}
	return grpc.NewClient(addr, append(protocol.DialOptions(), grpc.WithTransportCredentials(m.ClientCredentials()))...)
}

func tlsArgs(f tlsconfig.Files) []string {
	return []string{"-tls-ca", f.CA, "-tls-cert", f.Cert, "-tls-key", f.Key}
}

// Node is one simulated node.
type Node struct {
	ID           string
	Index        int    // 1-based
	Netns        string // its network namespace's name (ip netns)
	Pool         string
	RootDataset  string
	IP           string
	AgentAddress string // where the controller reaches the node agent
	CSIEndpoint  string // the node's CSI socket (unix://...)
	Metrics      string // the node's Prometheus endpoint (http://...)
	Dir          string // the node's directory for staging and target paths
	// TLS is the node's certificate (role node) from the cluster's CA.
	TLS     tlsconfig.Files
	Process *Process
	// host holds the node's network and mount namespaces for the node's
	// whole life, as a machine does: the mounts zfs-node makes survive its
	// restart, as they do under Nomad.
	host *Process
	args []string
	c    *Cluster
}

// Start sets up and starts a cluster. On error, what was set up is undone.
func Start(opts Options) (_ *Cluster, err error) {
	if opts.LogLevel == "" {
		opts.LogLevel = "debug"
	}
	c := &Cluster{opts: opts}
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	// Every cluster gets its own throw-away CA: the agent ports speak only
	// mutual TLS, in tests as in production.
	if c.CA, err = tlsconfig.NewCA(opts.Dir); err != nil {
		return nil, err
	}
	if c.Operator, err = c.CA.Issue("operator", tlsconfig.RoleOperator); err != nil {
		return nil, err
	}
	if opts.Slot != 0 && opts.BackupTarget != "" {
		return nil, fmt.Errorf("a backup target runs in slot 0 only (TargetAddress), not in slot %d", opts.Slot)
	}
	if bridge := opts.bridge(); !haveLink(bridge) {
		batch := fmt.Sprintf("link add %[1]s type bridge\naddr add %[2]s/24 dev %[1]s\nlink set %[1]s up\n", bridge, opts.ip(254))
		if _, err := RunWithInput(batch, "ip", "-batch", "-"); err != nil {
			return nil, err
		}
		c.undo = append(c.undo, func() { _ = exec.Command("ip", "link", "del", bridge).Run() })
	}
	if opts.EncryptedRoots {
		if err := writeKeyFile(KeyFile(opts.Dir)); err != nil {
			return nil, err
		}
	}
	if opts.BackupTarget != "" {
		if err := c.setUpTarget(); err != nil {
			return nil, err
		}
		// First: a test's own -backup-targets in NodeArgs wins.
		c.opts.NodeArgs = append([]string{"-backup-targets", opts.BackupTarget + "=" + TargetAddress()}, c.opts.NodeArgs...)
	}
	if err := c.addNodes(); err != nil {
		return nil, err
	}
	// The nodes' processes start at once too, as a cluster's machines
	// do: each one's start (its binary paged in, libzfs opened, its pool
	// listed) takes a second or more under emulation.
	var started errgroup.Group
	for _, node := range c.Nodes {
		start := node.Start
		if opts.NoNodeProcesses {
			start = node.startHost
		}
		started.Go(start)
	}
	if err := started.Wait(); err != nil {
		return nil, err
	}
	// A node holds no lease until a majority of its peers answered, a beat
	// or two after they all run; until then it stages no primary. Tests
	// and the demo start staging at once, so wait for it here instead of
	// in every caller (a test that staged first failed at random).
	if opts.Lease > 0 && !opts.NoNodeProcesses {
		if err := c.waitForLeases(3 * opts.Lease); err != nil {
			return nil, err
		}
	}
	if !opts.NoController {
		c.ControllerEndpoint = "unix://" + filepath.Join(opts.Dir, "controller.sock")
		ctlTLS, err := c.CA.Issue("controller", tlsconfig.RoleController)
		if err != nil {
			return nil, err
		}
		c.ControllerMetrics = "http://" + opts.controllerMetrics(1) + "/metrics"
		c.controllerArgs = append([]string{"-peers", strings.Join(c.AgentAddresses(), ","), "-agent-timeout", "10s"}, tlsArgs(ctlTLS)...)
		if opts.BackupTarget != "" {
			c.controllerArgs = append(c.controllerArgs, "-backup-targets", opts.BackupTarget+"="+TargetAddress())
		}
		c.controllerArgs = append(c.controllerArgs, opts.ControllerArgs...)
		if err := c.StartController(); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// StartController starts the controller (again, after Controller.Kill)
// and waits for its CSI socket.
func (c *Cluster) StartController() error {
	p, err := c.startController("controller", c.ControllerEndpoint, c.opts.controllerMetrics(1))
	if err != nil {
		return err
	}
	c.Controller = p
	return nil
}

// StartControllerInstance starts instance n (2, 3, ...) of the
// controller beside the first, as Nomad runs several: the same peers and
// certificate, its own CSI socket and metrics port, and extra arguments
// after the first's. It returns the instance and its CSI endpoint; Close
// stops it.
func (c *Cluster) StartControllerInstance(n int, extra ...string) (*Process, string, error) {
	name := fmt.Sprintf("controller-%d", n)
	endpoint := "unix://" + filepath.Join(c.opts.Dir, name+".sock")
	p, err := c.startController(name, endpoint, c.opts.controllerMetrics(n), extra...)
	if err != nil {
		return nil, "", err
	}
	c.ControllerInstances = append(c.ControllerInstances, p)
	c.undo = append(c.undo, func() { p.Kill() })
	return p, endpoint, nil
}

// startController starts a controller process serving CSI at endpoint
// and metrics at metrics, and waits for its socket.
func (c *Cluster) startController(name, endpoint, metrics string, extra ...string) (*Process, error) {
	_ = os.Remove(strings.TrimPrefix(endpoint, "unix://"))
	args := append([]string{"-csi-endpoint", endpoint, "-metrics-address", metrics}, c.controllerArgs...)
	args = append(args, extra...)
	p, err := c.start(name, filepath.Join(c.opts.BinDir, "zfs-controller"), args...)
	if err != nil {
		return nil, err
	}
	return p, waitForSocket(endpoint, p)
}

// waitForLeases waits up to timeout until every running node reports on
// its metrics endpoint that it holds its lease (zfs_nomad_lease_held 1).
func (c *Cluster) waitForLeases(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for _, n := range c.Nodes {
		if n.Process == nil {
			continue
		}
		for !n.holdsLease() {
			if time.Now().After(deadline) {
				return fmt.Errorf("node %s did not hold its lease within %s of the start (waited for zfs_nomad_lease_held 1 on %s); log of %s:\n%s",
					n.ID, timeout, n.Metrics, n.Process.Name, tail(n.Process.Log, 40))
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	return nil
}

// holdsLease reads the node's lease gauge; false if it cannot be read.
func (n *Node) holdsLease() bool {
	v, err := n.Metric("zfs_nomad_lease_held")
	return err == nil && v == "1"
}

// Metric reads one unlabelled series from the node's metrics endpoint.
func (n *Node) Metric(name string) (string, error) {
	client := http.Client{Timeout: 2 * time.Second}
	resp, err := client.Get(n.Metrics)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(body), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == name {
			return f[1], nil
		}
	}
	return "", fmt.Errorf("%s has no series %s", n.Metrics, name)
}

// tail returns the last lines of the file at path, or why it cannot.
func tail(path string, lines int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	all := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	return strings.Join(all[max(0, len(all)-lines):], "\n")
}

// Close stops every process and removes namespaces and pools.
func (c *Cluster) Close() {
	if c.Controller != nil {
		c.Controller.Stop()
	}
	// The nodes stop at once, as machines do: each may take seconds to
	// end its streams.
	var wg sync.WaitGroup
	for _, n := range c.Nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if n.Process != nil {
				n.Process.Stop()
			}
			if n.host != nil {
				n.host.Kill()
			}
		}()
	}
	wg.Wait()
	for i := len(c.undo) - 1; i >= 0; i-- {
		c.undo[i]()
	}
	c.undo = nil
}

// addNodes sets up every node (pool, root dataset, namespaces, link,
// certificate) at once: each is a dozen commands, most of a cluster's
// start under emulation, and the nodes share nothing but the bridge.
func (c *Cluster) addNodes() error {
	nodes := make([]*Node, c.opts.Nodes)
	undos := make([][]func(), c.opts.Nodes)
	var g errgroup.Group
	for i := range nodes {
		g.Go(func() (err error) {
			nodes[i], undos[i], err = c.setUpNode(i + 1)
			return err
		})
	}
	err := g.Wait()
	for _, n := range nodes {
		if n != nil {
			c.Nodes = append(c.Nodes, n)
		}
	}
	c.undo = append(c.undo, func() { undoAtOnce(undos) })
	return err
}

// undoAtOnce runs each list of undos in reverse, the lists at once.
func undoAtOnce(lists [][]func()) {
	var wg sync.WaitGroup
	for _, undo := range lists {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := len(undo) - 1; i >= 0; i-- {
				undo[i]()
			}
		}()
	}
	wg.Wait()
}

// setUpNode sets up node i and returns it with what undoes it, in the
// order it was set up (also on error: what was set up by then).
func (c *Cluster) setUpNode(i int) (_ *Node, undo []func(), _ error) {
	id := fmt.Sprintf("n%d", i)
	node := &Node{
		ID: id, Index: i, Netns: c.opts.slotName(id), Pool: c.opts.slotName(fmt.Sprintf("pool%d", i)), IP: c.opts.ip(i),
		Dir: filepath.Join(c.opts.Dir, id), c: c,
	}
	node.RootDataset = node.Pool + "/nomad"
	node.AgentAddress = node.IP + ":7670"
	node.CSIEndpoint = "unix://" + filepath.Join(node.Dir, "csi.sock")
	node.Metrics = "http://" + node.IP + ":9670/metrics"
	if err := os.MkdirAll(node.Dir, 0o755); err != nil {
		return nil, undo, err
	}
	if err := CreatePool(node.Pool, Disk(c.opts.FirstDisk+i-1)); err != nil {
		return nil, undo, err
	}
	undo = append(undo, func() { DestroyPool(node.Pool) })
	if err := c.createRoot(node.RootDataset); err != nil {
		return nil, undo, err
	}
	// Undone also when set up only in part: the teardown ignores what is
	// not there.
	undo = append(undo, func() { tearDownNetwork(node.Netns, c.hostLink(i)) })
	if err := setUpNetwork(node.Netns, c.hostLink(i), node.IP, c.opts.bridge()); err != nil {
		return nil, undo, err
	}
	nodeTLS, err := c.CA.Issue(id, tlsconfig.RoleNode)
	if err != nil {
		return nil, undo, err
	}
	node.TLS = nodeTLS
	node.args = c.nodeArgs(node)
	return node, undo, nil
}

// createRoot creates a node's root dataset, encrypted with the cluster's
// key file if the options say so.
func (c *Cluster) createRoot(name string) error {
	create := []string{"create"}
	if c.opts.EncryptedRoots {
		key := KeyFile(c.opts.Dir)
		// Written by Start before the nodes are set up.
		create = append(create, "-o", "encryption=on", "-o", "keyformat=raw", "-o", "keylocation=file://"+key)
	}
	_, err := Run("zfs", append(create, name)...)
	return err
}

// setUpNetwork gives node id its network namespace, with eth0 at ip on
// the bridge through the veth pair whose root end is host.
func setUpNetwork(id, host, ip, bridge string) error {
	if err := removeLink(host); err != nil {
		return err
	}
	if _, err := Run("ip", "netns", "add", id); err != nil {
		return err
	}
	root := fmt.Sprintf("link add %s type veth peer name eth0 netns %s\nlink set %s master %s up\n", host, id, host, bridge)
	if _, err := RunWithInput(root, "ip", "-batch", "-"); err != nil {
		return err
	}
	inside := fmt.Sprintf("addr add %s/24 dev eth0\nlink set eth0 up\nlink set lo up\n", ip)
	_, err := RunWithInput(inside, "ip", "-n", id, "-batch", "-")
	return err
}

// hostLink names the root namespace's end of node i's veth pair.
func (c *Cluster) hostLink(i int) string { return c.opts.slotName("vh" + strconv.Itoa(i)) }

// haveLink reports whether a link of that name exists in the root
// namespace.
func haveLink(name string) bool {
	_, err := net.InterfaceByName(name)
	return err == nil
}

// tearDownNetwork removes what setUpNetwork made.
func tearDownNetwork(id, host string) {
	_ = exec.Command("ip", "netns", "del", id).Run()
	_ = removeLink(host)
}

// writeKeyFile writes the raw key of encrypted roots, once per cluster
// directory.
func writeKeyFile(path string) error {
	if _, err := os.Stat(path); err == nil {
		return nil
	}
	return os.WriteFile(path, []byte("zfs-nomad throw-away test key!!!"), 0o600) // 32 bytes, raw
}

// nodeArgs are node's zfs-node flags.
func (c *Cluster) nodeArgs(node *Node) []string {
	args := append([]string{
		"-node-id", node.ID, "-root-dataset", node.RootDataset, "-max-quota", "10G", "-default-quota", "256M",
		"-csi-endpoint", node.CSIEndpoint, "-agent-address", node.AgentAddress, "-metrics-address", node.IP + ":9670",
		"-allow-property", "compression=lz4:lz4|off|zstd", "-allow-property", "atime=off:on|off",
		"-mount-flags", "ro,noatime,nodev,nosuid,noexec", "-mount-base-dirs", node.Dir,
	}, tlsArgs(node.TLS)...)
	if c.opts.Lease > 0 {
		var peers []string
		for j := 1; j <= c.opts.Nodes; j++ {
			peers = append(peers, c.opts.ip(j)+":7670")
		}
		args = append(args, "-peers", strings.Join(peers, ","), "-lease", c.opts.Lease.String())
		var witnesses []string
		for _, j := range c.opts.Witnesses {
			witnesses = append(witnesses, fmt.Sprintf("n%d@%s:7670", j, c.opts.ip(j)))
		}
		if len(witnesses) > 0 {
			args = append(args, "-witnesses", strings.Join(witnesses, ","))
		}
	}
	return append(args, c.opts.NodeArgs...)
}

// removeLink makes sure the host end of a node's veth pair is gone. The
// kernel frees a deleted network namespace, and the veth pair in it, in
// the background, sometimes seconds later: a cluster started right after
// another closed would otherwise find the link name taken ("File
// exists"). Deleting one end deletes the pair.
func removeLink(host string) error {
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if exec.Command("ip", "link", "show", host).Run() != nil {
			return nil // gone
		}
		if time.Now().After(deadline) {
			_, err := Run("ip", "link", "del", host)
			return err
		}
	}
}

// Start starts (or restarts) the node's zfs-node in the node's network and
// mount namespaces and waits for its CSI socket.
func (n *Node) Start() error {
	if err := n.startHost(); err != nil {
		return err
	}
	p, err := n.StartProcess(n.ID, filepath.Join(n.c.opts.BinDir, "zfs-node"), n.args...)
	if err != nil {
		return err
	}
	n.Process = p
	if err := waitForSocket(n.CSIEndpoint, p); err != nil {
		return err
	}
	return waitForListener(n.host.Pid(), n.AgentAddress, p)
}

// waitForListener waits until a socket listens on addr's port in the
// network namespace of process pid: a node serves once its agent port
// listens, as the controller and the tests reach it there, and its CSI
// socket answering does not say that it does. /proc/PID/net/tcp and tcp6
// are read rather than the port dialed: they answer in the node's own
// namespace, also while the node's link is cut.
func waitForListener(pid int, addr string, p *Process) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	n, err := strconv.Atoi(port)
	if err != nil {
		return fmt.Errorf("agent address %s: %w", addr, err)
	}
	want := fmt.Sprintf(":%04X ", n)
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) && !p.Exited() {
		for _, table := range []string{"tcp", "tcp6"} {
			data, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/%s", pid, table))
			if err == nil && listens(string(data), want) {
				return nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	log, _ := os.ReadFile(p.Log)
	return fmt.Errorf("%s: nothing listened on %s within 30s; log of %s:\n%s", p.Name, addr, p.Name, log)
}

// listens says whether a /proc/net/tcp table has a socket in the LISTEN
// state (0A) whose local address ends in port (":1DF6 ").
func listens(table, port string) bool {
	for _, line := range strings.Split(table, "\n") {
		f := strings.Fields(line)
		if len(f) > 3 && strings.HasSuffix(f[1]+" ", port) && f[3] == "0A" {
			return true
		}
	}
	return false
}

// startHost starts the process holding the node's namespaces, once.
func (n *Node) startHost() error {
	if n.host != nil {
		return nil
	}
	// ip netns exec gives the holder the node's network namespace and a
	// mount namespace of its own.
	host, err := n.c.start(n.ID+"-host", "ip", "netns", "exec", n.Netns, "sleep", "1000000000")
	if err != nil {
		return err
	}
	n.host = host
	return waitForOwnNamespaces(host.Pid())
}

// StartProcess starts a background process in the node's network and
// mount namespaces, logging to <cluster dir>/<name>.log. Close does not
// stop it: the caller does.
func (n *Node) StartProcess(name, bin string, args ...string) (*Process, error) {
	args = append([]string{"-t", strconv.Itoa(n.host.Pid()), "-m", "-n", "--", bin}, args...)
	return n.c.start(name, "nsenter", args...)
}

// RestartWith stops the node's zfs-node and starts it again with extra
// flags added for good.
func (n *Node) RestartWith(extra ...string) error {
	n.Process.Stop()
	n.args = append(n.args, extra...)
	return n.Start()
}

// HostPid is a process in the node's namespaces, for nsenter.
func (n *Node) HostPid() int { return n.host.Pid() }

// Kill kills the node's zfs-node with SIGKILL.
func (n *Node) Kill() { n.Process.Kill() }

// CutLink takes the node off the network; RestoreLink puts it back.
func (n *Node) CutLink() error {
	_, err := Run("ip", "link", "set", n.c.hostLink(n.Index), "down")
	return err
}

func (n *Node) RestoreLink() error {
	_, err := Run("ip", "link", "set", n.c.hostLink(n.Index), "up")
	return err
}

// Exec runs a shell command in the node's mount and network namespaces,
// where its volumes are mounted.
func (n *Node) Exec(script string) (string, error) {
	return Run("nsenter", "-t", strconv.Itoa(n.host.Pid()), "-m", "-n", "--", "sh", "-c", script)
}

// ExecAs runs script on n as user and group id, without supplementary
// groups: an unprivileged workload.
func (n *Node) ExecAs(id int, script string) (string, error) {
	return Run("nsenter", "-t", strconv.Itoa(n.host.Pid()), "-m", "-n", "-S", strconv.Itoa(id), "-G", strconv.Itoa(id), "--", "sh", "-c", script)
}

// SendOverTCP pipes the output of send (a shell command writing a zfs
// stream, run on n) with socat over plain TCP into zfs receive -u target
// on node to: a transfer across the link between two nodes with neither
// the driver's framing nor its encryption, the baseline the benchmarks
// and the drain's goal compare with.
func (n *Node) SendOverTCP(to *Node, send, target string) error {
	return sendOverTCP(n.Exec, to.HostPid(), to.IP, send, target)
}

// SendToTarget is SendOverTCP into the backup target's namespace.
func (n *Node) SendToTarget(to *Target, send, target string) error {
	return sendOverTCP(n.Exec, to.host.Pid(), to.IP, send, target)
}

// SendOverTCP is Node.SendOverTCP from the backup target's namespace.
func (t *Target) SendOverTCP(to *Node, send, target string) error {
	run := func(script string) (string, error) {
		return Run("nsenter", "-t", strconv.Itoa(t.host.Pid()), "-m", "-n", "--", "sh", "-c", script)
	}
	return sendOverTCP(run, to.HostPid(), to.IP, send, target)
}

// sendOverTCP runs send | socat with run (in the sender's namespaces)
// into socat | zfs receive -u target in the network namespace of the
// process toPid, listening at toIP.
func sendOverTCP(run func(string) (string, error), toPid int, toIP, send, target string) error {
	const port = "9100"
	recv := exec.Command("nsenter", "-t", strconv.Itoa(toPid), "-n", "--", "sh", "-c",
		"socat -u TCP-LISTEN:"+port+",reuseaddr - | zfs receive -u "+target)
	out := &strings.Builder{}
	recv.Stdout, recv.Stderr = out, out
	if err := recv.Start(); err != nil {
		return err
	}
	// The sender retries until the listener is up.
	if o, err := run(send + " | socat -u - TCP:" + toIP + ":" + port + ",retry=200,interval=0.05"); err != nil {
		_ = recv.Process.Kill()
		_ = recv.Wait()
		return fmt.Errorf("%s | socat: %w: %s", send, err, o)
	}
	if err := recv.Wait(); err != nil {
		return fmt.Errorf("socat | zfs receive -u %s: %w: %s", target, err, out)
	}
	return nil
}

// Process is a background process logging to a file.
type Process struct {
	Name string
	Log  string
	cmd  *exec.Cmd
	done chan struct{}
}

// StartProcess starts a background process in the root namespaces,
// logging to <cluster dir>/<name>.log. Close does not stop it: the caller
// does.
func (c *Cluster) StartProcess(name, bin string, args ...string) (*Process, error) {
	return c.start(name, bin, args...)
}

func (c *Cluster) start(name, bin string, args ...string) (*Process, error) {
	logPath := filepath.Join(c.opts.Dir, name+".log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), "ZFS_NOMAD_LOG_LEVEL="+c.opts.LogLevel)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &Process{Name: name, Log: logPath, cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); logf.Close(); close(p.done) }()
	return p, nil
}

// Pid returns the process ID.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Kill ends the process at once.
func (p *Process) Kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

// Stop ends the process gracefully, then by force.
func (p *Process) Stop() {
	if p.Exited() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	began := time.Now()
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		fmt.Fprintf(os.Stderr, "guestcluster: %s did not stop within 15 s of SIGTERM: killed\n", p.Name)
		p.Kill()
		return
	}
	// Nomad gives a task kill_timeout (5 s by default) before SIGKILL.
	if took := time.Since(began); took > 5*time.Second {
		fmt.Fprintf(os.Stderr, "guestcluster: %s took %s to stop after SIGTERM\n", p.Name, took.Round(time.Millisecond))
	}
}

// Exited reports whether the process has ended.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// waitForOwnNamespaces waits until process pid has left our network and
// mount namespaces: nsenter before that would enter ours.
func waitForOwnNamespaces(pid int) error {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		moved := true
		for _, ns := range []string{"net", "mnt"} {
			theirs, err1 := os.Readlink(fmt.Sprintf("/proc/%d/ns/%s", pid, ns))
			ours, err2 := os.Readlink("/proc/self/ns/" + ns)
			if err1 != nil || err2 != nil || theirs == ours {
				moved = false
			}
		}
		if moved {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("process %d did not enter its node's namespaces within 10s", pid)
}

func waitForSocket(endpoint string, p *Process) error {
	path := strings.TrimPrefix(endpoint, "unix://")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for ctx.Err() == nil {
		if conn, err := net.Dial("unix", path); err == nil {
			conn.Close()
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	log, _ := os.ReadFile(p.Log)
	return fmt.Errorf("%s did not come up within 30s; log of %s:\n%s", path, p.Name, log)
}
