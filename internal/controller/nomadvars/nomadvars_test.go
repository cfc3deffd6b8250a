package nomadvars

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
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
	if err := c.Put(context.Background(), "zfs-nomad/tls/node-client-1", items); err != nil {
		t.Fatal(err)
	}
	if got.method != http.MethodPut || got.path != "/v1/var/zfs-nomad/tls/node-client-1" || got.namespace != "storage" || got.token != "secret" ||
		got.body.Path != "zfs-nomad/tls/node-client-1" || got.body.Namespace != "storage" || got.body.Items["key"] != "KEY" || len(got.body.Items) != 3 {
		t.Errorf("Nomad received %+v", got)
	}

	status = http.StatusForbidden
	err = c.Put(context.Background(), "zfs-nomad/tls/controller", items)
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
