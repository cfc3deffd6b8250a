package nomad

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/testbed/guestcluster"
	"github.com/zfs-nomad/zfs-nomad/internal/testbed/guesttest"
)

// envImages names the host directory holding the images' docker-archive
// files (hack/images.sh with ARCHIVE_DIR), which make test-nomad passes.
const envImages = "ZFS_NOMAD_IMAGES"

// The archives in envImages, and the Docker Engines' root in the guest:
// a tmpfs mounted before the nodes' namespaces exist, so every node sees
// it, with a directory per node (data, exec root, socket).
var imageArchives = []string{"zfs-node.tar", "zfs-controller.tar"}

const dockerDir = "/docker"

// flavour is how the plugins and the example job run: under the docker
// driver from the images (what nomad/ ships) or under raw_exec and exec
// from the binaries (nomad/raw_exec/, for clients without Docker).
type flavour struct {
	jobDir string // job files' directory below nomad/: "" or "raw_exec"
	docker bool
}

var (
	dockerFlavour  = flavour{docker: true}
	rawExecFlavour = flavour{jobDir: "raw_exec"}
)

// haveImages skips the test when the guest run has no image archives.
func haveImages(t testing.TB, bin string) {
	t.Helper()
	for _, name := range imageArchives {
		if _, err := os.Stat(filepath.Join(bin, name)); err != nil {
			t.Skipf("no image archive %s: set %s to hack/images.sh's ARCHIVE_DIR (make test-nomad does)", name, envImages)
		}
	}
}

// dockerSocket is the API socket of a node's Docker Engine.
func dockerSocket(n *guestcluster.Node) string { return filepath.Join(dockerDir, n.ID, "docker.sock") }

// startDocker starts a Docker Engine in each node's network and mount
// namespaces, as a client host has one, with the images loaded. Returns
// the images' names by archive.
//
// The images are loaded once, into the first node's engine, whose data
// root is then copied to the others before each starts: loading them into
// every engine took two minutes of the guest's emulated CPUs.
func (e *e2e) startDocker() map[string]string {
	e.t.Helper()
	began := time.Now()
	first := e.c.Nodes[0]
	loader := e.startDockerd(first)
	names := map[string]string{}
	for _, archive := range imageArchives {
		name, err := loadImage(dockerSocket(first), filepath.Join(e.bin, archive))
		if err != nil {
			e.t.Fatalf("%s: loading %s: %v", first.ID, archive, err)
		}
		names[archive] = name
	}
	loader.Stop()
	for _, n := range e.c.Nodes[1:] {
		// GNU cp (the docker guest has it): -a keeps the overlay2 layers'
		// extended attributes, which mark opaque directories.
		guesttest.Run(e.t, "mkdir", "-p", filepath.Join(dockerDir, n.ID))
		guesttest.Run(e.t, "cp", "-a", filepath.Join(dockerDir, first.ID, "data"), filepath.Join(dockerDir, n.ID, "data"))
	}
	for _, n := range e.c.Nodes {
		e.procs = append(e.procs, e.startDockerd(n))
	}
	for _, n := range e.c.Nodes {
		if err := waitForDocker(dockerSocket(n)); err != nil {
			e.t.Fatal(err)
		}
	}
	e.tell("FIGURE Docker Engines up with the images on %d nodes: %s", len(e.c.Nodes), time.Since(began).Round(100*time.Millisecond))
	return names
}

// startDockerd starts a node's Docker Engine.
//
// An Engine killed with its node leaves its pid files behind, its own
// and its containerd's. dockerd refuses to start while any process holds
// the PID its file names, and takes a live PID in containerd's file for
// its containerd still running; a guest's PIDs wrap at pid_max (32768
// with two CPUs), so a stale file may name a live process. Every process
// of the node is dead when it starts again (killEveryProcess), so the
// files only mislead.
func (e *e2e) startDockerd(n *guestcluster.Node) *guestcluster.Process {
	e.t.Helper()
	dir := filepath.Join(dockerDir, n.ID)
	guesttest.Run(e.t, "mkdir", "-p", dir)
	guesttest.Run(e.t, "rm", "-f", dir+"/dockerd.pid", dir+"/run/containerd/containerd.pid")
	// No iptables: the guest's kernel has no netfilter modules; the
	// default bridge network still gives containers a network of their
	// own. (guest/init moved the guest's root to a tmpfs, so runc can
	// pivot_root as on a client.)
	p, err := n.StartProcess("dockerd-"+n.ID, "dockerd",
		"--data-root", dir+"/data", "--exec-root", dir+"/run", "--pidfile", dir+"/dockerd.pid",
		"-H", "unix://"+dockerSocket(n), "--iptables=false", "--userland-proxy=false",
		"--exec-opt", "native.cgroupdriver=cgroupfs")
	if err != nil {
		e.t.Fatal(err)
	}
	return p
}

// dockerClient speaks to the Docker Engine API at socket.
func dockerClient(socket string) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
	}}
}

// waitForDocker waits up to a minute for the Docker Engine at socket to answer.
func waitForDocker(socket string) error {
	deadline := time.Now().Add(time.Minute)
	for {
		resp, err := dockerClient(socket).Get("http://docker/_ping")
		if err == nil {
			resp.Body.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no Docker Engine answering on %s: %w", socket, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// loadImage loads a docker-archive into the Docker Engine at socket, as
// `docker load -i` does, and returns the image's name.
func loadImage(socket, archive string) (string, error) {
	if err := waitForDocker(socket); err != nil {
		return "", err
	}
	f, err := os.Open(archive)
	if err != nil {
		return "", err
	}
	defer f.Close()
	resp, err := dockerClient(socket).Post("http://docker/images/load", "application/x-tar", f)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	// A stream of JSON messages: {"stream": "Loaded image: NAME\n"} or {"error": ...}.
	var all []string
	scanner := bufio.NewScanner(resp.Body)
	for scanner.Scan() {
		var msg struct{ Stream, Error string }
		if err := json.Unmarshal(scanner.Bytes(), &msg); err != nil {
			return "", fmt.Errorf("docker load answered %q: %w", scanner.Text(), err)
		}
		if msg.Error != "" {
			return "", fmt.Errorf("docker load: %s", msg.Error)
		}
		if name, ok := strings.CutPrefix(strings.TrimSpace(msg.Stream), "Loaded image: "); ok {
			return name, nil
		}
		all = append(all, scanner.Text())
	}
	return "", fmt.Errorf("docker load (status %s) named no image: %v %v", resp.Status, all, scanner.Err())
}

// driverConfig is a client's task driver configuration for the flavour.
func (f flavour) driverConfig(n *guestcluster.Node) string {
	if f.docker {
		// Privileged tasks and bind mounts for the node plugin; images
		// kept, as no registry could give them back.
		return fmt.Sprintf(`plugin "docker" {
  config {
    endpoint         = "unix://%s"
    allow_privileged = true
    volumes {
      enabled = true
    }
    gc {
      image = false
    }
  }
}
`, dockerSocket(n))
	}
	return `plugin "raw_exec" {
  config {
    enabled = true
  }
}
plugin "exec" {
  config {
    no_pivot_root = true
  }
}
`
}
