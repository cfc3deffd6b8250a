package csiplugin

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestHealthHandler(t *testing.T) {
	ok := HealthCheck{Name: "zfs", Check: func(context.Context) error { return nil }}
	lost := HealthCheck{Name: "lease", Check: func(context.Context) error { return errors.New("heard from no majority") }}
	stuck := HealthCheck{Name: "nodes", Check: func(ctx context.Context) error { <-ctx.Done(); return nil }}
	expired := CertificateCheck(func() time.Time { return time.Now().Add(-time.Minute) })
	valid := CertificateCheck(func() time.Time { return time.Now().Add(time.Hour) })
	tests := []struct {
		name   string
		checks []HealthCheck
		code   int
		body   []string
	}{
		{"every check passes", []HealthCheck{ok, valid}, http.StatusOK, []string{"ok"}},
		{"no checks", nil, http.StatusOK, []string{"ok"}},
		{"one fails", []HealthCheck{ok, lost}, http.StatusServiceUnavailable, []string{"lease: heard from no majority"}},
		{"each failure on its line", []HealthCheck{lost, expired}, http.StatusServiceUnavailable, []string{"lease: heard from no majority\ncertificate: the certificate in use expired at"}},
		{"a check that does not answer in time fails", []HealthCheck{ok, stuck}, http.StatusServiceUnavailable, []string{"nodes: no answer within"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			HealthHandler(tc.checks...).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, HealthPath, nil))
			if rec.Code != tc.code {
				t.Errorf("status %d, want %d; body %q", rec.Code, tc.code, rec.Body.String())
			}
			for _, want := range tc.body {
				if !strings.Contains(rec.Body.String(), want) {
					t.Errorf("body %q lacks %q", rec.Body.String(), want)
				}
			}
		})
	}
}
