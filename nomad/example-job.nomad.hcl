# A small stateful job using the volume from volume.hcl. Consumers must use
# the exec (or docker) driver: Nomad refuses CSI volumes for raw_exec tasks.
job "counter" {
  group "counter" {
    volume "data" {
      type            = "csi"
      source          = "web-data"
      access_mode     = "single-node-writer"
      attachment_mode = "file-system"
    }

    task "counter" {
      driver = "exec"

      volume_mount {
        volume      = "data"
        destination = "/data"
      }

      config {
        command = "/bin/sh"
        args    = ["-c", "while true; do date >> /data/log; sleep 5; done"]
      }
    }
  }
}
