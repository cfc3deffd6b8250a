package nomadapi

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
)

// TestPutSendsWhatNomadsAPITakes: the path, namespace, token and items
// reach the server as Nomad's variables API takes them; a refusal comes
// back with Nomad's words and, for a 403, the policy the token needs.
func TestPutSendsWhatNomadsAPITakes(t *testing.T) {
	var got struct {
		method, path, namespace, token string
		body                           struct {
			Namespace, Path string
			Items           map[string]string
		}
	}
	status := http.StatusOK
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.method, got.path, got.namespace, got.token = r.Method, r.URL.Path, r.URL.Query().Get("namespace"), r.Header.Get("X-Nomad-Token")
		if err := json.NewDecoder(r.Body).Decode(&got.body); err != nil {
			t.Errorf("body: %v", err)
		}
		w.WriteHeader(status)
		w.Write([]byte("Permission denied"))
	}))
	defer srv.Close()
	env := map[string]string{"NOMAD_ADDR": srv.URL, "NOMAD_TOKEN": "secret", "NOMAD_NAMESPACE": "storage"}
	c, err := FromEnv(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	items := map[string]string{"ca": "CA", "cert": "CERT", "key": "KEY"}
	if err := c.PutVariable(context.Background(), "zfs-nomad/tls/node-client-1", items); err != nil {
		t.Fatal(err)
	}
	if got.method != http.MethodPut || got.path != "/v1/var/zfs-nomad/tls/node-client-1" || got.namespace != "storage" || got.token != "secret" ||
		got.body.Path != "zfs-nomad/tls/node-client-1" || got.body.Namespace != "storage" || got.body.Items["key"] != "KEY" || len(got.body.Items) != 3 {
		t.Errorf("Nomad received %+v", got)
	}

	status = http.StatusForbidden
	err = c.PutVariable(context.Background(), "zfs-nomad/tls/controller", items)
	if err == nil || !strings.Contains(err.Error(), "403") || !strings.Contains(err.Error(), "Permission denied") || !strings.Contains(err.Error(), "variables write") {
		t.Errorf("a refused put: %v, want Nomad's answer and the policy the token needs", err)
	}
}

// TestFromEnv: Nomad's CLI defaults, and settings that cannot work
// refused before anything is sent.
func TestFromEnv(t *testing.T) {
	for _, tt := range []struct {
		env       map[string]string
		namespace string
		wantErr   string
	}{
		{env: map[string]string{}, namespace: "default"},
		{env: map[string]string{"NOMAD_ADDR": "https://nomad.example:4646", "NOMAD_NAMESPACE": "ops"}, namespace: "ops"},
		{env: map[string]string{"NOMAD_ADDR": "nomad.example:4646"}, wantErr: "want http://HOST:PORT"},
		{env: map[string]string{"NOMAD_ADDR": "https://n:4646", "NOMAD_CLIENT_CERT": "c.pem"}, wantErr: "set both or neither"},
		{env: map[string]string{"NOMAD_ADDR": "https://n:4646", "NOMAD_CACERT": "/nonexistent/ca.pem"}, wantErr: "NOMAD_CACERT"},
	} {
		c, err := FromEnv(func(k string) string { return tt.env[k] })
		switch {
		case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
			t.Errorf("%v: %v, want an error naming %q", tt.env, err, tt.wantErr)
		case tt.wantErr == "" && err != nil:
			t.Errorf("%v: %v", tt.env, err)
		case tt.wantErr == "" && c.Namespace() != tt.namespace:
			t.Errorf("%v: namespace %q, want %q", tt.env, c.Namespace(), tt.namespace)
		}
	}
}

// TestServiceAddresses: every registered instance as host:port, sorted
// and once each, from the namespace asked; a missing service is no error
// here (Nomad answers an empty list), a refusal names the capability.
func TestServiceAddresses(t *testing.T) {
	var asked string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked = r.URL.Path + "?" + r.URL.RawQuery
		switch r.URL.Path {
		case "/v1/service/zfs-nomad-agent":
			w.Write([]byte(`[{"ServiceName":"zfs-nomad-agent","Address":"10.0.0.2","Port":7670},
				{"ServiceName":"zfs-nomad-agent","Address":"10.0.0.1","Port":7670},
				{"ServiceName":"zfs-nomad-agent","Address":"10.0.0.1","Port":7670},
				{"ServiceName":"zfs-nomad-agent","Address":"fd00::3","Port":7670}]`))
		case "/v1/service/none":
			w.Write([]byte(`[]`))
		default:
			http.Error(w, "Permission denied", http.StatusForbidden)
		}
	}))
	defer srv.Close()
	c, err := FromEnv(func(k string) string {
		return map[string]string{"NOMAD_ADDR": srv.URL, "NOMAD_NAMESPACE": "storage"}[k]
	})
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.ServiceAddresses(context.Background(), "zfs-nomad-agent")
	if want := []string{"10.0.0.1:7670", "10.0.0.2:7670", "[fd00::3]:7670"}; err != nil || !slices.Equal(got, want) {
		t.Errorf("ServiceAddresses: %v, %v; want %v", got, err, want)
	}
	if asked != "/v1/service/zfs-nomad-agent?namespace=storage" {
		t.Errorf("asked %s", asked)
	}
	if got, err := c.ServiceAddresses(context.Background(), "none"); err != nil || len(got) != 0 {
		t.Errorf("an unregistered service: %v, %v; want none", got, err)
	}
	if _, err := c.ServiceAddresses(context.Background(), "secret"); err == nil || !strings.Contains(err.Error(), "read-job") {
		t.Errorf("a refused read: %v, want the capability named", err)
	}
}
