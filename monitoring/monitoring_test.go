// Package monitoring holds the alert rules and the Grafana dashboard
// (no Go code): its test holds them to the series the plugins export.
package monitoring

import (
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var (
	// seriesName is a name of ours in a query; the Go runtime's and the
	// process's (go_*, process_*) come from client_golang's collectors.
	seriesName = regexp.MustCompile(`\bzfs_nomad_[a-z_]+\b`)
	// declared is a metric name as the sources declare it: a string
	// literal (Counter, Gauge, Histogram, GaugesAtScrape, CallMetrics).
	declared  = regexp.MustCompile(`"(zfs_nomad_[a-z_]+)"`)
	alertExpr = regexp.MustCompile(`(?m)^\s*expr:\s*(.+)$`)
	alertName = regexp.MustCompile(`(?m)^\s*- alert:\s*(\S+)`)
)

// exported are the metric names the binaries' sources declare (tests
// left out), histograms with their _bucket, _count and _sum series.
func exported(t *testing.T) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	for _, dir := range []string{"../cmd", "../internal"} {
		err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			src, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for _, m := range declared.FindAllStringSubmatch(string(src), -1) {
				for _, suffix := range []string{"", "_bucket", "_count", "_sum"} {
					names[m[1]+suffix] = true
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if !names["zfs_nomad_lease_held"] || !names["zfs_nomad_csi_call_seconds_bucket"] {
		t.Fatalf("found no declaration of zfs_nomad_lease_held or zfs_nomad_csi_call_seconds in the sources: %d names", len(names))
	}
	return names
}

// queries are the dashboard's queries: every "expr" and every
// variable's "query", wherever they are.
func queries(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile("dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash any
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("dashboard.json: %v", err)
	}
	var out []string
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				if s, ok := x.(string); ok && (k == "expr" || k == "query") && strings.Contains(s, "zfs_nomad_") {
					out = append(out, s)
				}
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	walk(dash)
	return out
}

// TestQueriesNameExportedSeries: every series the alert rules and the
// dashboard ask for is one the plugins export, so a renamed or
// misspelled metric fails here rather than in an operator's empty graph
// or an alert that never fires.
func TestQueriesNameExportedSeries(t *testing.T) {
	names := exported(t)
	rules, err := os.ReadFile("alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var exprs []string
	for _, m := range alertExpr.FindAllStringSubmatch(string(rules), -1) {
		exprs = append(exprs, m[1])
	}
	dashboard := queries(t)
	if len(exprs) < 8 || len(dashboard) < 20 {
		t.Fatalf("%d alert expressions and %d dashboard queries found: the files' shape changed under this test", len(exprs), len(dashboard))
	}
	for _, q := range append(exprs, dashboard...) {
		for _, name := range seriesName.FindAllString(q, -1) {
			if !names[name] {
				t.Errorf("%s is not a series the plugins export, in %q", name, q)
			}
		}
	}
}

// TestAlertsAreDocumented: each alert has its row in docs/monitoring.md,
// which says what it means and what to do.
func TestAlertsAreDocumented(t *testing.T) {
	rules, err := os.ReadFile("alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile("../docs/monitoring.md")
	if err != nil {
		t.Fatal(err)
	}
	alerts := alertName.FindAllStringSubmatch(string(rules), -1)
	if len(alerts) == 0 {
		t.Fatal("no alert found in alerts.yml")
	}
	for _, m := range alerts {
		if !strings.Contains(string(doc), "| `"+m[1]+"` |") {
			t.Errorf("alert %s has no row in docs/monitoring.md", m[1])
		}
	}
}
