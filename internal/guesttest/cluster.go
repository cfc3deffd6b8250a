package guesttest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Disk returns the device of the guest's i-th disk (0: /dev/vda).
func Disk(i int) string { return "/dev/vd" + string(rune('a'+i)) }

// Run runs a command and fails the test with its output if it fails.
func Run(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// Pool creates pool name on disk and destroys it when the test ends. The
// disk is partitioned first: whole-disk vdevs wait for udev, which the guest
// does not run.
func Pool(t testing.TB, name, disk string) {
	t.Helper()
	Run(t, "sh", "-c", fmt.Sprintf("echo ',,' | sfdisk -q --wipe always %s >/dev/null", disk))
	Run(t, "zpool", "create", "-f", "-O", "mountpoint=none", name, disk+"1")
	t.Cleanup(func() { _ = exec.Command("zpool", "destroy", "-f", name).Run() })
}

// Cluster is a set of simulated nodes in one guest: each node has its own
// pool on its own disk, its own network namespace and IP, its own directory
// for mounts, and its own zfs-node process; a zfs-controller runs in the
// root namespace and reaches the nodes over a bridge.
type Cluster struct {
	t          testing.TB
	dir        string
	Nodes      []*Node
	Controller *Process
	// ControllerEndpoint is the controller's CSI endpoint.
	ControllerEndpoint string
}

// Node is one simulated node.
type Node struct {
	ID          string
	Index       int // 1-based
	Pool        string
	RootDataset string
	IP          string
	// AgentAddress is where the controller reaches the node agent.
	AgentAddress string
	// CSIEndpoint is the node's CSI socket (unix://...).
	CSIEndpoint string
	// Dir is the node's own directory for staging and target paths.
	Dir     string
	Process *Process
	args    []string
	c       *Cluster
}

// ClusterOptions shape a cluster.
type ClusterOptions struct {
	// NodeArgs are extra zfs-node flags for every node.
	NodeArgs []string
	// ControllerArgs are extra zfs-controller flags.
	ControllerArgs []string
	// NoController leaves the controller out.
	NoController bool
}

const bridge = "zbr0"

// StartCluster starts n nodes on disks 0..n-1 and a controller.
func StartCluster(t testing.TB, n int, opts ClusterOptions) *Cluster {
	t.Helper()
	c := &Cluster{t: t, dir: t.TempDir()}
	if _, err := net.InterfaceByName(bridge); err != nil {
		Run(t, "ip", "link", "add", bridge, "type", "bridge")
		Run(t, "ip", "addr", "add", "10.77.0.254/24", "dev", bridge)
		Run(t, "ip", "link", "set", bridge, "up")
	}
	var peers []string
	for i := 1; i <= n; i++ {
		node := c.addNode(i, opts.NodeArgs)
		peers = append(peers, node.AgentAddress)
	}
	for _, node := range c.Nodes {
		node.Start()
	}
	if !opts.NoController {
		c.ControllerEndpoint = "unix://" + filepath.Join(c.dir, "controller.sock")
		args := append([]string{"-csi-endpoint", c.ControllerEndpoint, "-peers", strings.Join(peers, ","), "-agent-timeout", "10s"}, opts.ControllerArgs...)
		c.Controller = start(t, "controller", filepath.Join(c.dir, "controller.log"), nil, BinPath(t, "zfs-controller"), args...)
		waitForSocket(t, strings.TrimPrefix(c.ControllerEndpoint, "unix://"))
	}
	return c
}

func (c *Cluster) addNode(i int, extra []string) *Node {
	t := c.t
	id := fmt.Sprintf("n%d", i)
	node := &Node{
		ID: id, Index: i, Pool: "pool" + fmt.Sprint(i), IP: fmt.Sprintf("10.77.0.%d", i),
		Dir: filepath.Join(c.dir, id), c: c,
	}
	node.RootDataset = node.Pool + "/nomad"
	node.AgentAddress = node.IP + ":7670"
	node.CSIEndpoint = "unix://" + filepath.Join(node.Dir, "csi.sock")
	if err := os.MkdirAll(node.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	Pool(t, node.Pool, Disk(i-1))
	Run(t, "zfs", "create", node.RootDataset)

	ns, host := id, "vh"+fmt.Sprint(i)
	Run(t, "ip", "netns", "add", ns)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	Run(t, "ip", "link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", ns)
	Run(t, "ip", "link", "set", host, "master", bridge, "up")
	Run(t, "ip", "-n", ns, "addr", "add", node.IP+"/24", "dev", "eth0")
	Run(t, "ip", "-n", ns, "link", "set", "eth0", "up")
	Run(t, "ip", "-n", ns, "link", "set", "lo", "up")

	node.args = append([]string{
		"-node-id", id, "-root-dataset", node.RootDataset, "-max-quota", "10G", "-default-quota", "256M",
		"-csi-endpoint", node.CSIEndpoint, "-agent-address", node.AgentAddress,
		"-allow-property", "compression=lz4:lz4|off|zstd", "-allow-property", "atime=off:on|off",
	}, extra...)
	c.Nodes = append(c.Nodes, node)
	return node
}

// Start starts (or restarts) the node's zfs-node and waits for its sockets.
func (n *Node) Start() {
	t := n.c.t
	t.Helper()
	args := append([]string{"netns", "exec", n.ID, BinPath(t, "zfs-node")}, n.args...)
	n.Process = start(t, n.ID, filepath.Join(n.c.dir, n.ID+".log"), nil, "ip", args...)
	waitForSocket(t, strings.TrimPrefix(n.CSIEndpoint, "unix://"))
}

// Kill kills the node's zfs-node with SIGKILL.
func (n *Node) Kill() { n.Process.Kill() }

// CutLink takes the node off the network; RestoreLink puts it back.
func (n *Node) CutLink()     { Run(n.c.t, "ip", "link", "set", "vh"+fmt.Sprint(n.Index), "down") }
func (n *Node) RestoreLink() { Run(n.c.t, "ip", "link", "set", "vh"+fmt.Sprint(n.Index), "up") }

// Process is a background process whose log is shown if the test fails.
type Process struct {
	Name string
	Log  string
	cmd  *exec.Cmd
	done chan struct{}
}

func start(t testing.TB, name, logPath string, env []string, bin string, args ...string) *Process {
	t.Helper()
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), append([]string{"ZFS_NOMAD_LOG_LEVEL=debug"}, env...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", name, err)
	}
	p := &Process{Name: name, Log: logPath, cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); logf.Close(); close(p.done) }()
	t.Cleanup(func() {
		p.Stop()
		if t.Failed() {
			if data, err := os.ReadFile(logPath); err == nil {
				t.Logf("---- log of %s ----\n%s", name, tail(string(data), 200))
			}
		}
	})
	return p
}

// Kill ends the process at once.
func (p *Process) Kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

// Stop ends the process gracefully, then by force.
func (p *Process) Stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		p.Kill()
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

func waitForSocket(t testing.TB, path string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for ctx.Err() == nil {
		if conn, err := net.Dial("unix", path); err == nil {
			conn.Close()
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s did not come up within 30s", path)
}

func tail(s string, lines int) string {
	parts := strings.Split(s, "\n")
	if len(parts) > lines {
		parts = parts[len(parts)-lines:]
	}
	return strings.Join(parts, "\n")
}
