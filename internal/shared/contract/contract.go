// Package contract holds the words the controller and the nodes share about a
// volume: its IDs, the roles a copy plays, the parameters a job submitter
// gives at create and the policies they name. Both binaries import it; it
// imports no ZFS, mount or node code, so the controller links none.
package contract
