# The node plugin: one zfs-node per Nomad client with a ZFS pool.
#
# Runs under raw_exec (no Docker needed): a node plugin under exec would make
# its mounts in a private mount namespace the consumers never see. Set
# stage_publish_base_dir so Nomad sends host paths rather than container
# paths. Draft: not yet run on a real Nomad agent (see README.md).
variable "binary" {
  description = "Path of zfs-node on the clients"
  default     = "/usr/local/bin/zfs-node"
}
variable "root_dataset" {
  description = "Parent dataset of all volumes on every client (must exist)"
  default     = "tank/nomad"
}
variable "max_quota" {
  default = "100G"
}
variable "default_quota" {
  default = "1G"
}
variable "agent_port" {
  default = 7670
}
variable "tls_dir" {
  description = "Directory on every client holding ca.pem, node.pem, node-key.pem (certificate OU \"node\", DNS name node.zfs-nomad; see docs/security.md)"
  default     = "/etc/zfs-nomad"
}
variable "data_dir" {
  description = "The clients' Nomad data_dir"
  default     = "/opt/nomad/data"
}

job "zfs-nomad-node" {
  type = "system"

  group "node" {
    network {
      port "agent" {
        static = var.agent_port
      }
    }

    # Native service discovery: the controller's template renders the agents
    # from this service, so no Nomad token is handed to the plugin.
    service {
      name     = "zfs-nomad-agent"
      provider = "nomad"
      port     = "agent"
    }

    task "zfs-node" {
      driver = "raw_exec"

      config {
        command = var.binary
        args = [
          "-node-id", "${node.unique.name}",
          "-root-dataset", var.root_dataset,
          "-max-quota", var.max_quota,
          "-default-quota", var.default_quota,
          "-agent-address", "${NOMAD_IP_agent}:${NOMAD_PORT_agent}",
          "-tls-ca", "${var.tls_dir}/ca.pem",
          "-tls-cert", "${var.tls_dir}/node.pem",
          "-tls-key", "${var.tls_dir}/node-key.pem",
          "-allow-property", "compression=lz4:lz4|zstd|off",
          "-allow-property", "atime=off:on|off",
        ]
      }

      csi_plugin {
        id                     = "zfs-nomad"
        type                   = "node"
        mount_dir              = "/csi"
        stage_publish_base_dir = "${var.data_dir}/client/csi/node/zfs-nomad"
      }

      resources {
        cpu    = 100
        memory = 128
      }
    }
  }
}
