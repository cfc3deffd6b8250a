package nomad

import (
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/testbed/guestcluster"
)

// envPrometheus names a Prometheus server on the host, built with Nomad's
// service discovery (hack/prometheus-server.sh); make test sets it.
// Without it the scenario runs without a Prometheus.
const envPrometheus = "ZFS_NOMAD_PROMETHEUS"

// promAddr is the guest's Prometheus, in the root namespace beside the
// Nomad server.
const promAddr = serverIP + ":9090"

// prometheusConfig is docs/monitoring.md's scrape configuration, with
// intervals short enough for a test: Nomad's service discovery finds
// both plugins' metrics services, and the rules are the repository's.
// Not shorter: each scrape has every node plugin read its pool, and at
// 2 s the scrapes took about a tenth of the guest's CPU
// (docs/testing.md, "On their own").
func prometheusConfig(rules string) string {
	return fmt.Sprintf(`global:
  scrape_interval: 5s
  evaluation_interval: 5s
rule_files:
  - %s
scrape_configs:
  - job_name: zfs-nomad
    nomad_sd_configs:
      - server: %s
        refresh_interval: 5s
    relabel_configs:
      - source_labels: [__meta_nomad_service]
        regex: zfs-nomad-(node|controller)-metrics
        action: keep
      - source_labels: [__meta_nomad_service]
        target_label: service
      - source_labels: [__meta_nomad_node_id]
        target_label: nomad_node_id
`, rules, apiAddr)
}

// startPrometheus starts a real Prometheus on the alert rules of
// monitoring/ and waits until it scrapes the three node plugins and the
// two controller instances it found through Nomad, and sees one holder
// of the work lease. It reports false, and the scenario goes on without
// it, when the run has no Prometheus binary.
func (e *e2e) startPrometheus() bool {
	e.t.Helper()
	bin := filepath.Join(e.bin, "prometheus")
	if _, err := os.Stat(bin); err != nil {
		e.tell("no Prometheus binary (%s unset): the alerts are not checked against a real Prometheus", envPrometheus)
		return false
	}
	config := e.writeFile("prometheus.yml", prometheusConfig(filepath.Join(e.repo, "monitoring", "alerts.yml")))
	p, err := e.c.StartProcess("prometheus", bin, "--config.file="+config, "--storage.tsdb.path="+filepath.Join(e.c.Dir(), "prometheus"),
		"--web.listen-address="+promAddr)
	if err != nil {
		e.t.Fatal(err)
	}
	e.procs = append(e.procs, p)
	e.eventually(2*time.Minute, "Prometheus scraping 3 node plugins and 2 controller instances found through Nomad", func() error {
		up, err := e.promTargetsUp()
		if err != nil {
			return err
		}
		if up["zfs-nomad-node-metrics"] != 3 || up["zfs-nomad-controller-metrics"] != 2 {
			return fmt.Errorf("targets up by service: %v", up)
		}
		return nil
	})
	e.eventually(time.Minute, "one controller instance holding the work lease, in Prometheus", func() error {
		holders, err := e.promQuery(`zfs_nomad_work_lease_held == 1`)
		if err != nil || len(holders) != 1 {
			return fmt.Errorf("series %v (%v)", holders, err)
		}
		return nil
	})
	e.tell("Prometheus scrapes the plugins it found through Nomad's service discovery and evaluates monitoring/alerts.yml")
	return true
}

// promTargetsUp counts the active targets that are up, by the Nomad
// service they were found as.
func (e *e2e) promTargetsUp() (map[string]int, error) {
	var body struct {
		Data struct {
			ActiveTargets []struct {
				Labels map[string]string `json:"labels"`
				Health string            `json:"health"`
			} `json:"activeTargets"`
		} `json:"data"`
	}
	if err := promGet("/api/v1/targets?state=active", &body); err != nil {
		return nil, err
	}
	up := map[string]int{}
	for _, t := range body.Data.ActiveTargets {
		if t.Health == "up" {
			up[t.Labels["service"]]++
		}
	}
	return up, nil
}

// promSeries is one series of a query's answer: its labels.
type promSeries map[string]string

// promQuery runs an instant query.
func (e *e2e) promQuery(query string) ([]promSeries, error) {
	var body struct {
		Data struct {
			Result []struct {
				Metric promSeries `json:"metric"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := promGet("/api/v1/query?query="+url.QueryEscape(query), &body); err != nil {
		return nil, err
	}
	out := make([]promSeries, 0, len(body.Data.Result))
	for _, r := range body.Data.Result {
		out = append(out, r.Metric)
	}
	return out, nil
}

// promAlert is the state of the alert name on the series of node's
// Nomad client, or "" when it is neither pending nor firing there.
func (e *e2e) promAlert(name string, node *guestcluster.Node) (string, error) {
	var body struct {
		Data struct {
			Alerts []struct {
				Labels map[string]string `json:"labels"`
				State  string            `json:"state"`
			} `json:"alerts"`
		} `json:"data"`
	}
	if err := promGet("/api/v1/alerts", &body); err != nil {
		return "", err
	}
	for _, a := range body.Data.Alerts {
		if a.Labels["alertname"] == name && a.Labels["nomad_node_id"] == e.nodeIDs[node.ID] {
			return a.State, nil
		}
	}
	return "", nil
}

// waitForAlert waits until the alert name is in state on node's plugin
// ("firing", or "" for resolved).
func (e *e2e) waitForAlert(limit time.Duration, name string, node *guestcluster.Node, state string) {
	e.t.Helper()
	what := fmt.Sprintf("Prometheus's alert %s on %s %s", name, node.ID, cmpOr(state, "resolved"))
	e.eventually(limit, what, func() error {
		got, err := e.promAlert(name, node)
		if err == nil && got != state {
			err = fmt.Errorf("its state is %q", cmpOr(got, "inactive"))
		}
		return err
	})
	e.tell("%s", what)
}

// wantLagSeriesOn waits until Prometheus's replica-lag series of volume
// id name exactly the nodes holding its replicas (its copies but the
// primary's): the primary's node none, so a moved volume's series
// followed it.
func (e *e2e) wantLagSeriesOn(id, primary string) {
	e.t.Helper()
	var got, want []string
	e.eventually(time.Minute, "the replica-lag series of "+id+" on the nodes of its replicas", func() error {
		want = slices.DeleteFunc(e.holders(id), func(n string) bool { return n == primary })
		series, err := e.promQuery(fmt.Sprintf(`zfs_nomad_replica_lag_seconds{volume_id=%q}`, id))
		if err != nil {
			return err
		}
		got = got[:0]
		for _, s := range series {
			got = append(got, s["node"])
		}
		sort.Strings(got)
		if len(want) == 0 || !slices.Equal(got, want) {
			return fmt.Errorf("series on %v, want %v (primary on %s)", got, want, primary)
		}
		return nil
	})
	e.tell("the replica-lag series of the moved volume name %s, not its primary's node %s", strings.Join(want, ", "), primary)
}

func promGet(path string, out any) error { return getJSON("http://"+promAddr+path, out) }

func cmpOr(s, otherwise string) string {
	if s == "" {
		return otherwise
	}
	return s
}
