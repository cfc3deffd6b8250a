package lease

import (
	"errors"
	"testing"
	"time"
)

// clock is a settable time for tests.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func TestHeldNeedsAMajorityOfAllPeersWithinTheLease(t *testing.T) {
	const lease = 10 * time.Second
	type answer struct {
		addr, node, domain string
		ago                time.Duration
	}
	tests := []struct {
		name    string
		peers   []string
		answers []answer
		want    bool
	}{
		{"a domain of one", nil, nil, true},
		{"two of three heard", []string{"a", "b"}, []answer{{"a", "n2", "d", time.Second}}, true},
		{"one of three heard", []string{"a", "b"}, nil, false},
		{"an answer older than the lease", []string{"a", "b"}, []answer{{"a", "n2", "d", lease}}, false},
		{"its own address counts once", []string{"self", "a", "b"}, []answer{{"self", "n1", "d", 0}, {"a", "n2", "d", time.Second}}, true},
		{"alone with its own address", []string{"self", "a", "b"}, []answer{{"self", "n1", "d", 0}}, false},
		{"another domain counts", []string{"a", "b", "c"}, []answer{{"b", "x1", "other", 0}, {"c", "x2", "other", 0}}, true},
		// Domains X={n1,n2,n3}, Y={x1,x2}; n1 hears only n2: two of its
		// domain's three, but two of five nodes, so no lease.
		{"a majority of the domain is not a majority of the nodes", []string{"n2", "n3", "x1", "x2"}, []answer{{"n2", "n2", "d", 0}}, false},
		{"a peer never heard counts against", []string{"a", "b", "c"}, []answer{{"a", "n2", "d", 0}}, false},
		{"two of four is no majority", []string{"a", "b", "c"}, []answer{{"a", "n2", "d", 0}}, false},
		{"three of four", []string{"a", "b", "c"}, []answer{{"a", "n2", "d", 0}, {"b", "n3", "d", 0}}, true},
		// A node listed by name and by IP is one node: n2 heard at both
		// of its addresses is two of four nodes (n1, n2, n3, n4), not
		// three of five.
		{"a node under two addresses counts once", []string{"n2.example", "10.0.0.2", "n3", "n4"},
			[]answer{{"n2.example", "n2", "d", 0}, {"10.0.0.2", "n2", "d", 0}}, false},
		{"aliases and a third node", []string{"n2.example", "10.0.0.2", "n3"},
			[]answer{{"n2.example", "n2", "d", 0}, {"10.0.0.2", "n2", "d", 0}}, true},
		{"an alias heard long ago counts with the other address", []string{"n2.example", "10.0.0.2", "n3"},
			[]answer{{"n2.example", "n2", "d", lease}, {"10.0.0.2", "n2", "d", 0}}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &clock{t: time.Unix(1000, 0)}
			m := NewMonitor(lease, c.now)
			m.SetPeers(tt.peers)
			c.t = c.t.Add(time.Minute)
			for _, a := range tt.answers {
				c.t = c.t.Add(-a.ago)
				m.Answered(a.addr, a.node)
				c.t = c.t.Add(a.ago)
			}
			if got := m.Held("n1"); got != tt.want {
				t.Errorf("Held = %v, want %v", got, tt.want)
			}
		})
	}
	// A node configured with peers that knows none yet is not a domain of
	// one: it has not learned them.
	m := NewMonitor(lease, time.Now)
	m.RequirePeers()
	if m.Held("n1") {
		t.Error("Held before any peer is known, with peers configured: true, want false")
	}
}

// TestPeersNeverShrink: a re-read peers file adds addresses but drops
// none. A file rendered from service discovery loses the nodes a
// partition hides; were they dropped, a cut-off node would count itself
// a majority of what is left.
func TestPeersNeverShrink(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	m := NewMonitor(10*time.Second, c.now)
	m.SetPeers([]string{"a", "b"})
	m.Answered("a", "n2")
	m.SetPeers([]string{"a"}) // b is gone from the file
	if !m.Held("n1") {
		t.Error("a's answer was lost when the peers changed")
	}
	c.t = c.t.Add(time.Minute) // nobody answers any more
	m.SetPeers(nil)
	if m.Held("n1") {
		t.Error("with its peers dropped from the file, a node that hears from nobody holds the lease")
	}
	m.SetPeers([]string{"c"})
	if n := len(m.Peers()); n != 3 {
		t.Errorf("peers after adding c: %d, want a, b and c", n)
	}
}

// TestAttest: a node attests the silence of peers that have not answered
// it for the time needed, counted from its own start for one that never
// did; it cannot attest an address it does not ping; without peers it
// keeps no lease and attests nothing: a node without peers that attested
// anything would let nodes with the binary's default grant every failover
// at once.
func TestAttest(t *testing.T) {
	const need = 20 * time.Second
	tests := []struct {
		name       string
		peers      []string
		started    time.Duration // before now
		heard      time.Duration // before now; 0: never
		want       bool
		needsPeers bool // configured with peers (RequirePeers)
	}{
		{"silent long enough", []string{"a"}, time.Hour, 25 * time.Second, true, false},
		{"answered lately", []string{"a"}, time.Hour, 5 * time.Second, false, false},
		{"never answered, this node up long enough", []string{"a"}, 30 * time.Second, 0, true, false},
		{"never answered, this node just started", []string{"a"}, 5 * time.Second, 0, false, false},
		{"not among the peers", []string{"b"}, time.Hour, 0, false, false},
		{"no peers: no lease kept, nothing attested", nil, time.Hour, 0, false, false},
		// Seeds 1593 and 2786 of the simulation: a node that had just
		// started granted a failover before its first beat.
		{"peers configured, none learned yet", nil, time.Hour, 0, false, true},
		{"peers configured and learned", []string{"a"}, time.Hour, 25 * time.Second, true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &clock{t: time.Unix(10000, 0)}
			c.t = c.t.Add(-tt.started)
			m := NewMonitor(10*time.Second, c.now)
			if tt.needsPeers {
				m.RequirePeers()
			}
			m.SetPeers(tt.peers)
			c.t = c.t.Add(tt.started)
			if tt.heard > 0 {
				c.t = c.t.Add(-tt.heard)
				m.Answered("a", "n2")
				c.t = c.t.Add(tt.heard)
			}
			err := m.Attest([]string{"a"}, need)
			if (err == nil) != tt.want {
				t.Errorf("Attest: %v, want attested %v", err, tt.want)
			}
			if noLease := tt.peers == nil && !tt.needsPeers; noLease != errors.Is(err, ErrNoLease) {
				t.Errorf("Attest: %v; want ErrNoLease only without peers configured", err)
			}
		})
	}
}

// TestAttestFailoverAsksAfterPeersTheControllerLost: node c knows a-e
// (its own address among them). The controller, whose peer list lost a
// and b, names nobody silent and c, d and e answering: c still attests
// a's and b's silence, and refuses while a answered it lately. Members
// counts the five, which the controller takes its majority over.
func TestAttestFailoverAsksAfterPeersTheControllerLost(t *testing.T) {
	const need = 20 * time.Second
	tests := []struct {
		name      string
		from      []string
		answering []string
		aHeard    time.Duration // before now
		want      bool
	}{
		{"a, not listed, answered lately", nil, []string{"c", "d", "e"}, 5 * time.Second, false},
		{"a, not listed, silent long enough", nil, []string{"c", "d", "e"}, 25 * time.Second, true},
		{"a answering the controller", nil, []string{"a", "c", "d", "e"}, 5 * time.Second, true},
		{"a named silent by the controller", []string{"addr-a"}, []string{"a", "c", "d", "e"}, 5 * time.Second, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &clock{t: time.Unix(10000, 0)}
			m := NewMonitor(10*time.Second, c.now)
			m.SetPeers([]string{"addr-a", "addr-b", "addr-c", "addr-d", "addr-e"})
			c.t = c.t.Add(time.Hour)
			for _, p := range []string{"b", "c", "d", "e"} {
				m.Answered("addr-"+p, p)
			}
			c.t = c.t.Add(-tt.aHeard)
			m.Answered("addr-a", "a")
			c.t = c.t.Add(tt.aHeard)
			c.t = c.t.Add(time.Second) // b, c, d and e answered a second ago: b is not silent
			answering := append([]string{"b"}, tt.answering...)
			err := m.AttestFailover("c", tt.from, answering, need)
			if (err == nil) != tt.want {
				t.Errorf("AttestFailover: %v, want attested %v", err, tt.want)
			}
			if got := m.Members("c"); got != 5 {
				t.Errorf("Members = %d, want 5", got)
			}
		})
	}
	// b silent too and not answering: attested along with a.
	c := &clock{t: time.Unix(10000, 0)}
	m := NewMonitor(10*time.Second, c.now)
	m.SetPeers([]string{"addr-a", "addr-b", "addr-c"})
	m.Answered("addr-c", "c")
	c.t = c.t.Add(time.Hour)
	m.Answered("addr-b", "b")
	if err := m.AttestFailover("c", nil, []string{"c"}, need); err == nil {
		t.Error("AttestFailover attested b's silence one moment after b answered")
	}
	// A node without peers has nobody to vouch for beyond the named.
	alone := NewMonitor(10*time.Second, time.Now)
	if err := alone.AttestFailover("c", nil, []string{"c"}, need); err != nil {
		t.Errorf("a node without peers, nobody named silent: %v, want nil", err)
	}
	if err := alone.AttestFailover("c", []string{"addr-a"}, []string{"c"}, need); !errors.Is(err, ErrNoLease) {
		t.Errorf("a node without peers, a named silent: %v, want ErrNoLease", err)
	}
	if got := alone.Members("c"); got != 0 {
		t.Errorf("Members of a node without peers = %d, want 0", got)
	}
	// Until its own ping is answered, its own address is one more
	// unnamed peer: it reports nothing rather than four of three.
	fresh := NewMonitor(10*time.Second, time.Now)
	fresh.SetPeers([]string{"addr-a", "addr-b", "addr-c"})
	fresh.Answered("addr-a", "a")
	if got := fresh.Members("c"); got != 0 {
		t.Errorf("Members before the node found itself among its peers = %d, want 0", got)
	}
	fresh.Answered("addr-c", "c")
	if got := fresh.Members("c"); got != 3 {
		t.Errorf("Members once it found itself = %d, want 3", got)
	}
}

func TestSilentSaysWhichPeersWentQuietAndWhy(t *testing.T) {
	const lease = 10 * time.Second
	c := &clock{t: time.Unix(1000, 0)}
	m := NewMonitor(lease, c.now)
	m.SetPeers([]string{"self:7670", "a:7670", "b:7670", "c:7670"})
	m.Answered("self:7670", "n1")
	m.Answered("a:7670", "n2")
	m.Answered("b:7670", "n3")
	c.t = c.t.Add(12 * time.Second)
	m.Answered("a:7670", "n2")
	m.Failed("b:7670", errors.New("context deadline exceeded"))
	m.Failed("c:7670", errors.New("connection refused"))
	got := m.Silent("n1")
	want := []string{
		"b:7670 (n3): last answered 12s ago: context deadline exceeded",
		"c:7670: never answered: connection refused",
	}
	if len(got) != len(want) {
		t.Fatalf("Silent = %q, want %q", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("Silent[%d] = %q, want %q", i, got[i], want[i])
		}
	}
}
