package metrics

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestExposition: the driver's families in the text format, labels
// sorted and escaped, deleted series gone; the Go and process
// collectors beside them.
func TestExposition(t *testing.T) {
	r := NewRegistry()
	sent := r.Counter("zfs_nomad_bytes_sent_total", "Bytes sent.", "peer")
	lag := r.Gauge("zfs_nomad_lag_seconds", "Lag, in \\ seconds\nof a replica.", "volume_id", "node")
	sent.Add(10, "n2")
	sent.Add(5, "n2")
	sent.Add(-3, "n2") // a counter never goes down
	sent.Add(1, `we"ird`)
	sent.Add(1, "too", "many") // dropped, not a crash
	lag.Set(3.5, "vol-1", "n2")
	lag.Set(1, "vol-2", "n3")
	lag.Delete("vol-2", "n3")
	if again := r.Counter("zfs_nomad_bytes_sent_total", "Bytes sent.", "peer"); again.counter != sent.counter {
		t.Error("declaring a counter twice made a second family")
	}
	r.BuildInfo(map[string]string{"version": "v1.2.3", "agent_protocol": "1"})
	var b strings.Builder
	if _, err := r.WriteTo(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"# HELP zfs_nomad_bytes_sent_total Bytes sent.\n# TYPE zfs_nomad_bytes_sent_total counter\nzfs_nomad_bytes_sent_total{peer=\"n2\"} 15\nzfs_nomad_bytes_sent_total{peer=\"we\\\"ird\"} 1\n",
		"# HELP zfs_nomad_lag_seconds Lag, in \\\\ seconds\\nof a replica.\n# TYPE zfs_nomad_lag_seconds gauge\nzfs_nomad_lag_seconds{node=\"n2\",volume_id=\"vol-1\"} 3.5\n",
		"zfs_nomad_build_info{agent_protocol=\"1\",version=\"v1.2.3\"} 1\n",
		"\ngo_goroutines ",
		"\nprocess_resident_memory_bytes ",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("the exposition lacks\n%s\nin\n%s", want, b.String())
		}
	}
	if strings.Contains(b.String(), "vol-2") {
		t.Errorf("a deleted series is still there:\n%s", b.String())
	}
}

// TestOpenMetricsWhenAsked: the handler speaks OpenMetrics to a scraper
// that asks for it, the text format to the others.
func TestOpenMetricsWhenAsked(t *testing.T) {
	r := NewRegistry()
	r.Gauge("zfs_nomad_lease_held", "1 while the lease is held.").Set(1)
	for _, tc := range []struct{ accept, contentType, ends string }{
		{"", "text/plain; version=0.0.4", "zfs_nomad_lease_held 1\n"},
		{"application/openmetrics-text; version=1.0.0", "application/openmetrics-text; version=1.0.0", "# EOF\n"},
	} {
		req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
		if tc.accept != "" {
			req.Header.Set("Accept", tc.accept)
		}
		rec := httptest.NewRecorder()
		r.Handler().ServeHTTP(rec, req)
		if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, tc.contentType) || !strings.Contains(rec.Body.String(), "zfs_nomad_lease_held 1") || !strings.HasSuffix(rec.Body.String(), tc.ends) && tc.accept != "" {
			t.Errorf("Accept %q: content type %q, body ending %q; want %q and the series", tc.accept, ct, tail(rec.Body.String()), tc.contentType)
		}
	}
}

func tail(s string) string { return s[max(0, len(s)-40):] }

// TestGaugesAtScrape: values read at each scrape; a failed read leaves
// them out of that scrape.
func TestGaugesAtScrape(t *testing.T) {
	r := NewRegistry()
	free, fail := 100.0, false
	r.GaugesAtScrape(map[string]string{"zfs_nomad_free_bytes": "Free bytes."}, func() (map[string]float64, error) {
		if fail {
			return nil, errors.New("the pool did not answer")
		}
		return map[string]float64{"zfs_nomad_free_bytes": free, "undeclared": 1}, nil
	})
	scrape := func() string {
		var b strings.Builder
		if _, err := r.WriteTo(&b); err != nil {
			t.Fatal(err)
		}
		return b.String()
	}
	if got := scrape(); !strings.Contains(got, "\nzfs_nomad_free_bytes 100\n") || strings.Contains(got, "undeclared") {
		t.Errorf("first scrape:\n%s", got)
	}
	free = 40
	if got := scrape(); !strings.Contains(got, "\nzfs_nomad_free_bytes 40\n") {
		t.Errorf("the value read again at the second scrape:\n%s", got)
	}
	fail = true
	if got := scrape(); strings.Contains(got, "zfs_nomad_free_bytes ") {
		t.Errorf("a failed read still gave a value:\n%s", got)
	}
}

// TestLabelledGaugesAtScrape: the series are what the read gives at each
// scrape, so one it no longer gives is gone; samples of an undeclared
// name or with the wrong labels are dropped.
func TestLabelledGaugesAtScrape(t *testing.T) {
	r := NewRegistry()
	samples := []Sample{
		{Name: "zfs_nomad_volume_used_bytes", Labels: []string{"v1", "web"}, Value: 10},
		{Name: "zfs_nomad_volume_used_bytes", Labels: []string{"v2", "db"}, Value: 20},
		{Name: "zfs_nomad_volume_used_bytes", Labels: []string{"v3"}, Value: 30},
		{Name: "undeclared", Labels: []string{"v1", "web"}, Value: 1},
	}
	r.LabelledGaugesAtScrape(map[string]string{"zfs_nomad_volume_used_bytes": "Used."}, []string{"volume_id", "volume_name"},
		func() ([]Sample, error) { return samples, nil })
	scrape := func() string {
		var b strings.Builder
		if _, err := r.WriteTo(&b); err != nil {
			t.Fatal(err)
		}
		return b.String()
	}
	got := scrape()
	for _, want := range []string{`zfs_nomad_volume_used_bytes{volume_id="v1",volume_name="web"} 10`, `zfs_nomad_volume_used_bytes{volume_id="v2",volume_name="db"} 20`} {
		if !strings.Contains(got, want) {
			t.Errorf("first scrape lacks %s:\n%s", want, got)
		}
	}
	if strings.Contains(got, "v3") || strings.Contains(got, "undeclared") {
		t.Errorf("a sample with one label value, or of an undeclared name, was kept:\n%s", got)
	}
	samples = samples[1:2]
	if got := scrape(); strings.Contains(got, `volume_id="v1"`) || !strings.Contains(got, `volume_id="v2"`) {
		t.Errorf("the second scrape is not what the read gave (v2 alone):\n%s", got)
	}
}

// TestOverlappingScrapesShareARead: scrapes that come while a read runs
// wait for it and give its values, rather than starting reads of their
// own (a slow listing must not run once per scrape at once).
func TestOverlappingScrapesShareARead(t *testing.T) {
	r := NewRegistry()
	var reads atomic.Int32
	release := make(chan struct{})
	r.GaugesAtScrape(map[string]string{"zfs_nomad_free_bytes": "Free bytes."}, func() (map[string]float64, error) {
		reads.Add(1)
		<-release
		return map[string]float64{"zfs_nomad_free_bytes": 7}, nil
	})
	var wg sync.WaitGroup
	got := make([]string, 3)
	for i := range got {
		wg.Go(func() {
			var b strings.Builder
			if _, err := r.WriteTo(&b); err != nil {
				t.Error(err)
			}
			got[i] = b.String()
		})
	}
	// The three scrapes start; the read they share is held until then.
	for deadline := time.Now().Add(5 * time.Second); reads.Load() == 0 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
	close(release)
	wg.Wait()
	// Each scrape reading on its own makes three reads, all held until
	// the release; shared, one (two only if a scrape came that late).
	if n := reads.Load(); n >= 3 {
		t.Errorf("three overlapping scrapes made %d reads, want them to share one", n)
	}
	for i, g := range got {
		if !strings.Contains(g, "\nzfs_nomad_free_bytes 7\n") {
			t.Errorf("scrape %d lacks the shared read's value:\n%s", i, g)
		}
	}
}
