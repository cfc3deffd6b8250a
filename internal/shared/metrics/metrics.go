// Package metrics keeps the driver's few counters and gauges and serves
// them in the Prometheus text format. A handful of series does not warrant
// a client library and its dependencies; this is the whole of it.
package metrics

import (
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
)

// Registry holds metric families by name.
type Registry struct {
	mu       sync.Mutex
	families map[string]*family
}

type family struct {
	help, kind string
	labels     []string
	values     map[string]float64 // key: label values joined by \xff
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return &Registry{families: map[string]*family{}} }

// Vec is one metric family with its label names.
type Vec struct {
	r    *Registry
	name string
}

func (r *Registry) vec(name, help, kind string, labels []string) Vec {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.families[name]; !ok {
		r.families[name] = &family{help: help, kind: kind, labels: labels, values: map[string]float64{}}
	}
	return Vec{r: r, name: name}
}

// Counter declares a counter (only ever goes up).
func (r *Registry) Counter(name, help string, labels ...string) Vec {
	return r.vec(name, help, "counter", labels)
}

// Gauge declares a gauge (set to the current value).
func (r *Registry) Gauge(name, help string, labels ...string) Vec {
	return r.vec(name, help, "gauge", labels)
}

// Add adds v to the series with the given label values.
func (v Vec) Add(value float64, labelValues ...string) {
	v.update(labelValues, func(old float64) float64 { return old + value })
}

// Set sets the series with the given label values.
func (v Vec) Set(value float64, labelValues ...string) {
	v.update(labelValues, func(float64) float64 { return value })
}

// Reset removes every series of the family (a gauge recomputed whole).
func (v Vec) Reset() {
	v.r.mu.Lock()
	defer v.r.mu.Unlock()
	v.r.families[v.name].values = map[string]float64{}
}

// Delete removes a series (a gauge for something that is gone).
func (v Vec) Delete(labelValues ...string) {
	v.r.mu.Lock()
	defer v.r.mu.Unlock()
	delete(v.r.families[v.name].values, strings.Join(labelValues, "\xff"))
}

func (v Vec) update(labelValues []string, f func(float64) float64) {
	v.r.mu.Lock()
	defer v.r.mu.Unlock()
	fam := v.r.families[v.name]
	if len(labelValues) != len(fam.labels) {
		panic(fmt.Sprintf("metrics: %s takes labels %v, got %d values", v.name, fam.labels, len(labelValues)))
	}
	key := strings.Join(labelValues, "\xff")
	fam.values[key] = f(fam.values[key])
}

// WriteTo writes every family in the Prometheus text format, sorted.
func (r *Registry) WriteTo(w io.Writer) (int64, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	names := make([]string, 0, len(r.families))
	for n := range r.families {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		fam := r.families[name]
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s %s\n", name, fam.help, name, fam.kind)
		keys := make([]string, 0, len(fam.values))
		for k := range fam.values {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Fprintf(&b, "%s%s %g\n", name, labelText(fam.labels, k), fam.values[k])
		}
	}
	n, err := io.WriteString(w, b.String())
	return int64(n), err
}

func labelText(names []string, key string) string {
	if len(names) == 0 {
		return ""
	}
	values := strings.Split(key, "\xff")
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = fmt.Sprintf("%s=%q", n, values[i])
	}
	return "{" + strings.Join(parts, ",") + "}"
}

// Handler serves the registry at /metrics.
func (r *Registry) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		_, _ = r.WriteTo(w)
	})
}
