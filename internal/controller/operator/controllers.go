package operator

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/worklease"
)

// ControllerStatus is one controller instance as the nodes know it: an
// instance that asked a node for the work lease within the last three
// terms (docs/architecture.md, "Several controllers").
type ControllerStatus struct {
	ID      string    `json:"id"`
	Host    string    `json:"host,omitempty"`
	Address string    `json:"address,omitempty"` // its metrics address
	Version string    `json:"version,omitempty"`
	Started time.Time `json:"started,omitzero"`
	// NomadAlloc is its Nomad allocation's ID, when Nomad runs it.
	NomadAlloc string `json:"nomad_alloc_id,omitempty"`
	// LastSeen is when a node last heard from it.
	LastSeen time.Time `json:"last_seen"`
	// HoldsWorkLease: more than half the nodes grant it the lease, so
	// it runs the background work, since HolderSince (the earliest
	// start any granting node reports).
	HoldsWorkLease bool      `json:"holds_work_lease"`
	HolderSince    time.Time `json:"holder_since,omitzero"`
	// GrantedBy are the nodes that grant it the lease now.
	GrantedBy []string `json:"granted_by,omitempty"`
}

// controllerStatuses asks every node who holds its part of the work
// lease and whom it heard from, and merges the answers by instance.
// members is how many nodes a majority is taken over. A node that does
// not answer (or is older than the lease) is left out.
func controllerStatuses(ctx context.Context, cl *cluster.Cluster, nodes []cluster.Node, members int, now time.Time) []ControllerStatus {
	byID := map[string]*ControllerStatus{}
	get := func(in worklease.Instance) *ControllerStatus {
		c, ok := byID[in.ID]
		if !ok {
			c = &ControllerStatus{ID: in.ID, Host: in.Host, Address: in.Address, Version: in.Version, Started: in.Started, NomadAlloc: in.NomadAlloc}
			byID[in.ID] = c
		}
		return c
	}
	answers := cluster.Each(ctx, cl, nodes, func(ctx context.Context, n cluster.Node) (worklease.Lease, error) {
		return n.Agent.WorkLeases(ctx)
	})
	for _, a := range answers {
		if a.Err != nil {
			continue // the node table says what is wrong with it
		}
		for _, s := range a.Object.Seen {
			c := get(s.Instance)
			if seen := now.Add(-s.Ago); seen.After(c.LastSeen) {
				c.LastSeen = seen
			}
		}
		if h := a.Object.Holder; h.ID != "" {
			c := get(h)
			c.GrantedBy = append(c.GrantedBy, a.Node.Info.NodeID)
			if c.HolderSince.IsZero() || a.Object.HolderSince.Before(c.HolderSince) {
				c.HolderSince = a.Object.HolderSince
			}
		}
	}
	out := make([]ControllerStatus, 0, len(byID))
	for _, c := range byID {
		c.HoldsWorkLease = len(c.GrantedBy) > members/2
		if !c.HoldsWorkLease {
			c.HolderSince = time.Time{}
		}
		out = append(out, *c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// printControllers writes the controller instances the nodes know, and
// which one runs the background work.
func printControllers(out io.Writer, controllers []ControllerStatus, now time.Time) {
	if len(controllers) == 0 {
		fmt.Fprintf(out, "controller instances: none asked the nodes for the work lease lately; the replication schedule does not run\n\n")
		return
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CONTROLLER\tHOST\tADDRESS\tDRIVER\tSTARTED\tWORK LEASE")
	held := false
	for _, c := range controllers {
		lease := fmt.Sprintf("standby (asked %s ago)", ago(now, c.LastSeen))
		switch {
		case c.HoldsWorkLease:
			held = true
			lease = fmt.Sprintf("HOLDS it since %s (%s ago), granted by %s", c.HolderSince.UTC().Format(time.TimeOnly), ago(now, c.HolderSince), strings.Join(c.GrantedBy, ","))
		case len(c.GrantedBy) > 0:
			lease = fmt.Sprintf("granted by %s only, not a majority", strings.Join(c.GrantedBy, ","))
		}
		started := ""
		if !c.Started.IsZero() {
			started = ago(now, c.Started) + " ago"
		}
		host := c.Host
		if c.NomadAlloc != "" {
			host += " (alloc " + shortAlloc(c.NomadAlloc) + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", c.ID, host, c.Address, c.Version, started, lease)
	}
	tw.Flush()
	if !held {
		fmt.Fprintf(out, "  no instance holds the work lease now: the replication schedule waits (a node that started within %s grants nobody yet)\n", worklease.Term)
	}
	fmt.Fprintln(out)
}

// shortAlloc is an allocation ID as Nomad's CLI shows it: its first
// eight characters.
func shortAlloc(id string) string {
	if len(id) > 8 {
		return id[:8]
	}
	return id
}

func ago(now, t time.Time) string {
	return now.Sub(t).Round(time.Second).String()
}
