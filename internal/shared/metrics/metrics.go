// Package metrics is the driver's metrics registry: Prometheus's
// client_golang (with the Go runtime and process collectors) behind the
// small API the packages use, counter and gauge families declared by
// name and set by label values. Served in the Prometheus text format, or
// OpenMetrics when a scraper asks for it.
package metrics

import (
	"io"
	"maps"
	"net/http"
	"slices"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/common/expfmt"
	"golang.org/x/sync/singleflight"
)

// Registry holds metric families by name.
type Registry struct {
	reg *prometheus.Registry
}

// NewRegistry returns a registry with the Go runtime's and the process's
// collectors (go_*, process_*) and no families of the driver's yet.
func NewRegistry() *Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return &Registry{reg: reg}
}

// Vec is one metric family with its label names: a counter or a gauge.
type Vec struct {
	counter *prometheus.CounterVec
	gauge   *prometheus.GaugeVec
}

// Counter declares a counter (only ever goes up). Declaring a name
// twice returns the family declared first.
func (r *Registry) Counter(name, help string, labels ...string) Vec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
	if err := r.reg.Register(c); err != nil {
		if are, ok := err.(prometheus.AlreadyRegisteredError); ok {
			if existing, ok := are.ExistingCollector.(*prometheus.CounterVec); ok {
				return Vec{counter: existing}
			}
		}
		panic("metrics: declaring counter " + name + ": " + err.Error()) // a name reused for another kind: a defect, found at start
	}
	return Vec{counter: c}
}

// Gauge declares a gauge (set to the current value). Declaring a name
// twice returns the family declared first.
func (r *Registry) Gauge(name, help string, labels ...string) Vec {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels)
	if err := r.reg.Register(g); err != nil {
		if are, ok := err.(prometheus.AlreadyRegisteredError); ok {
			if existing, ok := are.ExistingCollector.(*prometheus.GaugeVec); ok {
				return Vec{gauge: existing}
			}
		}
		panic("metrics: declaring gauge " + name + ": " + err.Error())
	}
	return Vec{gauge: g}
}

// BuildInfo declares zfs_nomad_build_info, 1 with labels saying what
// runs (version, agent protocol, OpenZFS series), as Prometheus's
// convention for build information has it.
func (r *Registry) BuildInfo(labels map[string]string) {
	names := slices.Sorted(maps.Keys(labels))
	values := make([]string, len(names))
	for i, n := range names {
		values[i] = labels[n]
	}
	r.Gauge("zfs_nomad_build_info", "1, with labels saying which build of the driver runs: its version, agent protocol and OpenZFS series.", names...).Set(1, values...)
}

// HistogramVec is a histogram family with its label names.
type HistogramVec struct {
	h *prometheus.HistogramVec
}

// Histogram declares a histogram with the given upper bounds.
// Declaring a name twice returns the family declared first.
func (r *Registry) Histogram(name, help string, buckets []float64, labels ...string) HistogramVec {
	h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, labels)
	if err := r.reg.Register(h); err != nil {
		if are, ok := err.(prometheus.AlreadyRegisteredError); ok {
			if existing, ok := are.ExistingCollector.(*prometheus.HistogramVec); ok {
				return HistogramVec{h: existing}
			}
		}
		panic("metrics: declaring histogram " + name + ": " + err.Error())
	}
	return HistogramVec{h: h}
}

// Observe records value in the series with the given label values (a
// mismatch of label values is dropped).
func (v HistogramVec) Observe(value float64, labelValues ...string) {
	if o, err := v.h.GetMetricWithLabelValues(labelValues...); err == nil {
		o.Observe(value)
	}
}

// GaugesAtScrape declares unlabelled gauges, by name with their help,
// whose values read gives at each scrape: for what is cheap to read and
// wrong as soon as it was read (free space). A name read does not give,
// or an error, leaves the gauge out of that scrape.
func (r *Registry) GaugesAtScrape(help map[string]string, read func() (map[string]float64, error)) {
	r.LabelledGaugesAtScrape(help, nil, func() ([]Sample, error) {
		values, err := read()
		samples := make([]Sample, 0, len(values))
		for name, v := range values {
			samples = append(samples, Sample{Name: name, Value: v})
		}
		return samples, err
	})
}

// A Sample is one series' value read at a scrape: its family's name and
// its label values, in the order the family declared its labels.
type Sample struct {
	Name   string
	Labels []string
	Value  float64
}

// LabelledGaugesAtScrape declares gauges, by name with their help, all
// with the given label names, whose series read gives at each scrape
// (what a family holds is only what read gives: a series read no longer
// gives is gone at once, so none outlives what it measured). A sample of
// an undeclared name or with the wrong number of label values is
// dropped; an error leaves every family out of that scrape. Scrapes that
// overlap share one read: a read slower than the scrape interval (a
// listing on a busy pool) never runs twice at once, so the metrics hold
// no more of what they read from (libzfs's handles, the pool) than one
// read's worth, whatever the scrape rate.
func (r *Registry) LabelledGaugesAtScrape(help map[string]string, labels []string, read func() ([]Sample, error)) {
	c := &scraped{descs: map[string]*prometheus.Desc{}, labels: len(labels), read: read}
	for name, h := range help {
		c.descs[name] = prometheus.NewDesc(name, h, labels, nil)
	}
	r.reg.MustRegister(c)
}

type scraped struct {
	descs  map[string]*prometheus.Desc
	labels int
	read   func() ([]Sample, error)
	// reads joins a scrape to a read already running.
	reads singleflight.Group
}

func (c *scraped) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

func (c *scraped) Collect(ch chan<- prometheus.Metric) {
	read, err, _ := c.reads.Do("", func() (any, error) { return c.read() })
	samples, _ := read.([]Sample)
	if err != nil {
		return
	}
	for _, s := range samples {
		if d, ok := c.descs[s.Name]; ok && len(s.Labels) == c.labels {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, s.Value, s.Labels...)
		}
	}
}

// Add adds value to the series with the given label values. A counter
// takes no negative value (it is dropped); a mismatch of label values is
// a defect of the caller and is dropped too, never a crash.
func (v Vec) Add(value float64, labelValues ...string) {
	switch {
	case v.counter != nil:
		if c, err := v.counter.GetMetricWithLabelValues(labelValues...); err == nil && value >= 0 {
			c.Add(value)
		}
	case v.gauge != nil:
		if g, err := v.gauge.GetMetricWithLabelValues(labelValues...); err == nil {
			g.Add(value)
		}
	}
}

// Set sets the gauge series with the given label values (on a counter,
// nothing).
func (v Vec) Set(value float64, labelValues ...string) {
	if v.gauge == nil {
		return
	}
	if g, err := v.gauge.GetMetricWithLabelValues(labelValues...); err == nil {
		g.Set(value)
	}
}

// Reset removes every series of the family (a gauge recomputed whole).
func (v Vec) Reset() {
	if v.counter != nil {
		v.counter.Reset()
	}
	if v.gauge != nil {
		v.gauge.Reset()
	}
}

// Delete removes a series (a gauge for something that is gone).
func (v Vec) Delete(labelValues ...string) {
	if v.counter != nil {
		v.counter.DeleteLabelValues(labelValues...)
	}
	if v.gauge != nil {
		v.gauge.DeleteLabelValues(labelValues...)
	}
}

// WriteTo writes every family in the Prometheus text format, sorted by
// name, each series' labels sorted by name.
func (r *Registry) WriteTo(w io.Writer) (int64, error) {
	families, err := r.reg.Gather()
	if err != nil {
		return 0, err
	}
	cw := &countingWriter{w: w}
	enc := expfmt.NewEncoder(cw, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, f := range families {
		if err := enc.Encode(f); err != nil {
			return cw.n, err
		}
	}
	return cw.n, nil
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// Handler serves the registry: OpenMetrics to a scraper that asks for
// it, the Prometheus text format otherwise.
func (r *Registry) Handler() http.Handler {
	return promhttp.HandlerFor(r.reg, promhttp.HandlerOpts{EnableOpenMetrics: true})
}
