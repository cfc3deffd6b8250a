# The controller plugin: decides where volumes go; needs no ZFS.
# Draft: not yet run on a real Nomad agent (see README.md).
variable "binary" {
  description = "Path of zfs-controller on the clients"
  default     = "/usr/local/bin/zfs-controller"
}

variable "tls_dir" {
  description = "Directory on the clients holding ca.pem, controller.pem, controller-key.pem (certificate OU \"controller\")"
  default     = "/etc/zfs-nomad"
}

job "zfs-nomad-controller" {
  type = "service"

  group "controller" {
    count = 1

    task "zfs-controller" {
      driver = "raw_exec"

      config {
        command = var.binary
        args = [
          "-peers-file", "${NOMAD_TASK_DIR}/peers",
          "-tls-ca", "${var.tls_dir}/ca.pem",
          "-tls-cert", "${var.tls_dir}/controller.pem",
          "-tls-key", "${var.tls_dir}/controller-key.pem",
        ]
      }

      # The node agents, from Nomad's native service discovery. Nomad
      # re-renders the file when agents come and go; the controller re-reads
      # it on change (change_mode = "noop": no restart needed).
      template {
        destination = "local/peers"
        change_mode = "noop"
        data        = <<-EOT
        {{- range nomadService "zfs-nomad-agent" }}
        {{ .Address }}:{{ .Port }}
        {{- end }}
        EOT
      }

      csi_plugin {
        id        = "zfs-nomad"
        type      = "controller"
        mount_dir = "/csi"
      }

      resources {
        cpu    = 100
        memory = 64
      }
    }
  }
}
