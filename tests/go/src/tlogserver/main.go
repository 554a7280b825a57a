// Command tlogserver checks a running modelstate server's verifiable audit
// log with Go's reference implementations (golang.org/x/mod/sumdb/note and
// golang.org/x/mod/sumdb/tlog), and a witness against a rolled-back log:
//
//  1. It starts modelstate-server on a free loopback port with a witness key
//     this program made, makes records (module builds through
//     modelstatectl), and fetches two signed checkpoints, an inclusion proof
//     of every record and the consistency proof between the two with
//     modelstatectl --json. note.Open, tlog.ParseTree, tlog.CheckRecord
//     and tlog.CheckTree must accept them (and reject a flipped bit).
//  2. modelstatectl audit witness --once cosigns the latest checkpoint; the
//     server then serves it with that cosignature, which verifies here.
//  3. The data directory is rolled back to a copy taken earlier, and the
//     log grows differently. The server starts (its own checkpoint file was
//     rolled back too), but the witness must refuse: exit status 1, REFUSED
//     and both checkpoints on stdout.
//  4. (Before 3, on the same server.) modelstatectl attest signs a
//     module's attestation: its DSSE signature verifies here with
//     crypto/ed25519 over DSSE's PAE, the checkpoint it cites with
//     note.Open, and each audit record it lists with tlog.CheckRecord
//     against that checkpoint, the record's line fetched with
//     modelstatectl audit prove and hashed here (a wrong leaf must fail).
//
// Usage: tlogserver /path/to/modelstate-server /path/to/modelstatectl
package main

import (
	"bufio"
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

const witnessName = "go.example/witness"

var (
	serverBin, ctlBin, workDir string
	failures                   int
)

func fail(format string, args ...interface{}) {
	failures++
	fmt.Fprintf(os.Stderr, "FAIL: "+format+"\n", args...)
}

func must(err error, what string) {
	if err != nil {
		fmt.Fprintf(os.Stderr, "tlogserver: %s: %v\n", what, err)
		os.Exit(2)
	}
}

// server is one modelstate-server process.
type server struct {
	cmd  *exec.Cmd
	addr string
}

func freePort() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	must(err, "free port")
	defer l.Close()
	return l.Addr().String()
}

func startServer(dataDir, witnessKeys string) *server {
	addr := freePort()
	cmd := exec.Command(serverBin, "--listen="+addr, "--data_dir="+dataDir,
		"--audit_witness_keys="+witnessKeys, "--shutdown_grace_seconds=1")
	stderr, err := cmd.StderrPipe()
	must(err, "server stderr")
	must(cmd.Start(), "start server")
	lines := bufio.NewScanner(stderr)
	ready := make(chan bool)
	go func() {
		said := false
		for lines.Scan() {
			fmt.Fprintln(os.Stderr, "  server:", lines.Text())
			if !said && strings.Contains(lines.Text(), "listening on") {
				said = true
				ready <- true
			}
		}
		if !said {
			ready <- false
		}
	}()
	select {
	case ok := <-ready:
		if !ok {
			must(fmt.Errorf("exited before listening"), "start server")
		}
	case <-time.After(60 * time.Second):
		must(fmt.Errorf("not listening after 60 s"), "start server")
	}
	return &server{cmd, addr}
}

func (s *server) stop() {
	s.cmd.Process.Signal(os.Interrupt)
	s.cmd.Wait()
}

// ctl runs modelstatectl against the server; returns stdout and the exit
// status.
func (s *server) ctl(args ...string) (string, int) {
	cmd := exec.Command(ctlBin, append([]string{"--server=" + s.addr}, args...)...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	code := 0
	if exit, ok := err.(*exec.ExitError); ok {
		code = exit.ExitCode()
	} else {
		must(err, "run modelstatectl")
	}
	if code != 0 {
		fmt.Fprintf(os.Stderr, "  modelstatectl %s: exit %d\n%s%s", strings.Join(args, " "), code, out.String(), errOut.String())
	}
	return out.String(), code
}

func (s *server) ctlJSON(v interface{}, args ...string) {
	out, code := s.ctl(append([]string{"--json"}, args...)...)
	if code != 0 {
		must(fmt.Errorf("exit %d", code), strings.Join(args, " "))
	}
	// The first line: prove and consistency print the response, then
	// (without --json's text) nothing more.
	first := strings.SplitN(out, "\n", 2)[0]
	must(json.Unmarshal([]byte(first), v), "parse "+first)
}

func (s *server) build(name string) {
	spec := filepath.Join(workDir, "spec.json")
	must(os.WriteFile(spec, []byte(`{"type": "Linear", "args": [3, 2]}`), 0o644), "spec")
	if _, code := s.ctl("build", spec, "--name", name, "--seed", "1"); code != 0 {
		must(fmt.Errorf("exit %d", code), "build "+name)
	}
}

type checkpointJSON struct {
	Checkpoint  string `json:"checkpoint"`
	VerifierKey string `json:"verifier_key"`
}

type inclusionJSON struct {
	Seq        string   `json:"seq"`
	TreeSize   string   `json:"tree_size"`
	LeafHash   string   `json:"leaf_hash"`
	Proof      []string `json:"proof"`
	RecordLine string   `json:"record_line"`
}

type consistencyJSON struct {
	Proof []string `json:"proof"`
}

// parseCheckpoint reads a C2SP tlog-checkpoint: tlog.ParseTree's tree note
// with the origin in place of "go.sum database tree" (which ParseTree
// insists on).
func parseCheckpoint(text string) (tlog.Tree, error) {
	lines := strings.SplitAfter(text, "\n")
	if len(lines) < 4 || lines[0] != "modelstate/audit\n" {
		return tlog.Tree{}, fmt.Errorf("not a modelstate/audit checkpoint: %q", text)
	}
	body := "go.sum database tree\n" + lines[1] + lines[2]
	return tlog.ParseTree([]byte(body))
}

func decodeHashes(list []string) []tlog.Hash {
	out := make([]tlog.Hash, len(list))
	for i, s := range list {
		b, err := base64.StdEncoding.DecodeString(s)
		if err != nil || len(b) != tlog.HashSize {
			must(fmt.Errorf("%q", s), "hash")
		}
		copy(out[i][:], b)
	}
	return out
}

// fetchCheckpoint signs one now and checks it with note and tlog.
func (s *server) fetchCheckpoint(file string) (tlog.Tree, *note.Note, string) {
	var cp checkpointJSON
	s.ctlJSON(&cp, "audit", "checkpoint", "--fresh")
	v, err := note.NewVerifier(cp.VerifierKey)
	must(err, "note.NewVerifier(server key)")
	n, err := note.Open([]byte(cp.Checkpoint), note.VerifierList(v))
	if err != nil {
		fail("note.Open(checkpoint): %v", err)
		return tlog.Tree{}, nil, cp.VerifierKey
	}
	tree, err := parseCheckpoint(n.Text)
	if err != nil {
		fail("checkpoint text: %v", err)
	}
	must(os.WriteFile(file, []byte(cp.Checkpoint), 0o644), "save checkpoint")
	return tree, n, cp.VerifierKey
}

func checkProofs(s *server, old, cur tlog.Tree, oldFile, curFile, key string) {
	for seq := int64(1); seq <= cur.N; seq++ {
		var inc inclusionJSON
		s.ctlJSON(&inc, "audit", "prove", strconv.FormatInt(seq, 10),
			"--checkpoint", curFile, "--key", key)
		proof := tlog.RecordProof(decodeHashes(inc.Proof))
		leaf := tlog.RecordHash([]byte(inc.RecordLine))
		if got := decodeHashes([]string{inc.LeafHash})[0]; got != leaf {
			fail("seq %d: leaf_hash is not tlog.RecordHash(record_line)", seq)
		}
		if err := tlog.CheckRecord(proof, cur.N, cur.Hash, seq-1, leaf); err != nil {
			fail("seq %d: tlog.CheckRecord: %v", seq, err)
		}
		if len(proof) > 0 {
			proof[0][0] ^= 1
			if tlog.CheckRecord(proof, cur.N, cur.Hash, seq-1, leaf) == nil {
				fail("seq %d: a flipped proof bit still verifies", seq)
			}
		}
	}
	var con consistencyJSON
	s.ctlJSON(&con, "audit", "consistency", strconv.FormatInt(old.N, 10),
		strconv.FormatInt(cur.N, 10), "--checkpoint", oldFile, "--key", key)
	tp := tlog.TreeProof(decodeHashes(con.Proof))
	if err := tlog.CheckTree(tp, cur.N, cur.Hash, old.N, old.Hash); err != nil {
		fail("tlog.CheckTree(%d -> %d): %v", old.N, cur.N, err)
	}
	if len(tp) > 0 {
		tp[len(tp)-1][3] ^= 0x80
		if tlog.CheckTree(tp, cur.N, cur.Hash, old.N, old.Hash) == nil {
			fail("a flipped consistency proof bit still verifies")
		}
	}
	fmt.Printf("ok: %d inclusion proofs in tree %d and the consistency proof %d -> %d\n", cur.N, cur.N, old.N, cur.N)
}

// witnessKey writes a PKCS #8 PEM Ed25519 key and returns its cosignature
// verifier key (type 0x04) and public key.
func witnessKey(path string) (string, uint32, ed25519.PublicKey) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	must(err, "witness key")
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	must(err, "PKCS #8")
	must(os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600), "write witness key")
	typed := append([]byte{0x04}, pub...)
	h := sha256.New()
	h.Write([]byte(witnessName + "\n"))
	h.Write(typed)
	id := binary.BigEndian.Uint32(h.Sum(nil))
	return fmt.Sprintf("%s+%08x+%s", witnessName, id, base64.StdEncoding.EncodeToString(typed)), id, pub
}

// checkCosigned: the served checkpoint carries the witness's valid
// cosignature.
func checkCosigned(s *server, logKey string, id uint32, pub ed25519.PublicKey) {
	var cp checkpointJSON
	s.ctlJSON(&cp, "audit", "checkpoint")
	v, err := note.NewVerifier(logKey)
	must(err, "log key")
	n, err := note.Open([]byte(cp.Checkpoint), note.VerifierList(v))
	if err != nil {
		fail("note.Open(cosigned checkpoint): %v", err)
		return
	}
	for _, sig := range n.UnverifiedSigs {
		if sig.Name != witnessName || sig.Hash != id {
			continue
		}
		raw, err := base64.StdEncoding.DecodeString(sig.Base64)
		if err != nil || len(raw) != 4+8+ed25519.SignatureSize {
			fail("cosignature is malformed")
			return
		}
		t := binary.BigEndian.Uint64(raw[4:12])
		msg := fmt.Sprintf("cosignature/v1\ntime %d\n%s", t, n.Text)
		if !ed25519.Verify(pub, []byte(msg), raw[12:]) {
			fail("the served cosignature does not verify")
		}
		fmt.Println("ok: the server serves the checkpoint with the witness's cosignature")
		return
	}
	fail("the served checkpoint carries no cosignature by %s", witnessName)
}

type attestedRecord struct {
	Seq      int64  `json:"seq"`
	Type     string `json:"type"`
	LeafHash string `json:"leaf_hash"`
}

// attestationParts reads a DSSE envelope (checking its signature with the
// log's key over PAE) and returns the checkpoint note and the records its
// in-toto statement's SLSA byproducts cite.
func attestationParts(envelopeJSON []byte, logKey string) ([]byte, []attestedRecord, error) {
	var env struct {
		Payload     string `json:"payload"`
		PayloadType string `json:"payloadType"`
		Signatures  []struct {
			Sig string `json:"sig"`
		} `json:"signatures"`
	}
	if err := json.Unmarshal(envelopeJSON, &env); err != nil {
		return nil, nil, err
	}
	payload, err := base64.StdEncoding.DecodeString(env.Payload)
	if err != nil || len(env.Signatures) != 1 {
		return nil, nil, fmt.Errorf("malformed envelope")
	}
	sig, err := base64.StdEncoding.DecodeString(env.Signatures[0].Sig)
	if err != nil {
		return nil, nil, err
	}
	// <name>+<key ID>+<base64(0x01 || key)>; the base64 may hold '+'.
	parts := strings.SplitN(logKey, "+", 3)
	if len(parts) != 3 {
		return nil, nil, fmt.Errorf("malformed verifier key %q", logKey)
	}
	raw, err := base64.StdEncoding.DecodeString(parts[2])
	if err != nil || len(raw) != 1+ed25519.PublicKeySize || raw[0] != 1 {
		return nil, nil, fmt.Errorf("not an Ed25519 verifier key")
	}
	pae := fmt.Sprintf("DSSEv1 %d %s %d %s", len(env.PayloadType), env.PayloadType, len(payload), payload)
	if !ed25519.Verify(ed25519.PublicKey(raw[1:]), []byte(pae), sig) {
		return nil, nil, fmt.Errorf("the DSSE signature does not verify")
	}
	var statement struct {
		Predicate struct {
			RunDetails struct {
				Byproducts []struct {
					Name        string `json:"name"`
					Content     string `json:"content"`
					Annotations struct {
						Records []attestedRecord `json:"records"`
					} `json:"annotations"`
				} `json:"byproducts"`
			} `json:"runDetails"`
		} `json:"predicate"`
	}
	if err := json.Unmarshal(payload, &statement); err != nil {
		return nil, nil, err
	}
	var checkpoint []byte
	var records []attestedRecord
	for _, b := range statement.Predicate.RunDetails.Byproducts {
		switch b.Name {
		case "audit-checkpoint":
			checkpoint, err = base64.StdEncoding.DecodeString(b.Content)
			if err != nil {
				return nil, nil, err
			}
		case "audit-records":
			records = b.Annotations.Records
		}
	}
	if checkpoint == nil || len(records) == 0 {
		return nil, nil, fmt.Errorf("no audit-checkpoint or audit-records byproduct")
	}
	return checkpoint, records, nil
}

// checkAttestation: step 4.
func checkAttestation(s *server, module, logKey string) {
	file := filepath.Join(workDir, "attestation.dsse.json")
	if _, code := s.ctl("attest", module, "-o", file); code != 0 {
		fail("attest %s: exit %d", module, code)
		return
	}
	envelope, err := os.ReadFile(file)
	must(err, "read attestation")
	checkpoint, records, err := attestationParts(envelope, logKey)
	if err != nil {
		fail("attestation of %s: %v", module, err)
		return
	}
	v, err := note.NewVerifier(logKey)
	must(err, "log key")
	n, err := note.Open(checkpoint, note.VerifierList(v))
	if err != nil {
		fail("note.Open(the attestation's checkpoint): %v", err)
		return
	}
	tree, err := parseCheckpoint(n.Text)
	if err != nil {
		fail("the attestation's checkpoint: %v", err)
		return
	}
	cpFile := filepath.Join(workDir, "attested.checkpoint")
	must(os.WriteFile(cpFile, checkpoint, 0o644), "save checkpoint")
	types := map[string]int{}
	for _, r := range records {
		var inc inclusionJSON
		s.ctlJSON(&inc, "audit", "prove", strconv.FormatInt(r.Seq, 10),
			"--checkpoint", cpFile, "--key", logKey)
		leaf := tlog.RecordHash([]byte(inc.RecordLine))
		if fmt.Sprintf("%x", leaf[:]) != r.LeafHash {
			fail("attested record %d: its leaf hash is not that of the log's record", r.Seq)
			continue
		}
		proof := tlog.RecordProof(decodeHashes(inc.Proof))
		if err := tlog.CheckRecord(proof, tree.N, tree.Hash, r.Seq-1, leaf); err != nil {
			fail("attested record %d: tlog.CheckRecord: %v", r.Seq, err)
		}
		other := leaf
		other[0] ^= 1
		if tlog.CheckRecord(proof, tree.N, tree.Hash, r.Seq-1, other) == nil {
			fail("attested record %d: another leaf verifies too", r.Seq)
		}
		types[r.Type]++
	}
	if types["build"] != 1 {
		fail("the attestation of %s lists %d build records, want 1", module, types["build"])
	}
	fmt.Printf("ok: the attestation of %s verifies, and its %d records are included in its checkpoint of %d records\n", module, len(records), tree.N)
}

func copyDir(from, to string) {
	must(exec.Command("cp", "-a", from, to).Run(), "copy "+from)
}

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: tlogserver MODELSTATE_SERVER MODELSTATECTL")
		os.Exit(2)
	}
	serverBin, ctlBin = os.Args[1], os.Args[2]
	var err error
	workDir, err = os.MkdirTemp("", "tlogserver")
	must(err, "temp dir")
	defer os.RemoveAll(workDir)
	data := filepath.Join(workDir, "data")
	wkey := filepath.Join(workDir, "witness.pem")
	wvkey, wid, wpub := witnessKey(wkey)
	wkeys := filepath.Join(workDir, "witnesses")
	must(os.WriteFile(wkeys, []byte("# the test's witness\n"+wvkey+"\n"), 0o644), "witness keys")
	wstate := filepath.Join(workDir, "witness-state")

	// 1. Records, two checkpoints, every proof.
	s := startServer(data, wkeys)
	s.build("team/a")
	oldFile := filepath.Join(workDir, "old.checkpoint")
	old, _, logKey := s.fetchCheckpoint(oldFile)
	s.stop()
	copyDir(data, data+".old") // the rollback of step 3
	s = startServer(data, wkeys)
	s.build("team/b")
	s.build("team/c")
	curFile := filepath.Join(workDir, "cur.checkpoint")
	cur, _, _ := s.fetchCheckpoint(curFile)
	if cur.N <= old.N {
		fail("tree did not grow: %d -> %d", old.N, cur.N)
	}
	checkProofs(s, old, cur, oldFile, curFile, logKey)

	// 2. The witness cosigns.
	if out, code := s.ctl("audit", "witness", "--key", wkey, "--state", wstate,
		"--name", witnessName, "--log-key", logKey, "--once"); code != 0 || !strings.Contains(out, "cosigned") {
		fail("witness round: exit %d, %q", code, out)
	}
	checkCosigned(s, logKey, wid, wpub)
	checkAttestation(s, "team/b", logKey)
	s.stop()

	// 3. Roll back and grow differently: the witness refuses.
	must(os.RemoveAll(data), "remove data")
	must(os.Rename(data+".old", data), "roll back")
	s = startServer(data, wkeys)
	for _, m := range []string{"team/x", "team/y", "team/z"} {
		s.build(m)
	}
	s.ctl("audit", "checkpoint", "--fresh")
	out, code := s.ctl("audit", "witness", "--key", wkey, "--state", wstate,
		"--name", witnessName, "--log-key", logKey, "--once")
	if code != 1 || !strings.Contains(out, "REFUSED") ||
		strings.Count(out, "modelstate/audit\n") != 2 {
		fail("witness against a rolled-back log: exit %d, output %q", code, out)
	} else {
		fmt.Println("ok: the witness refused the rolled-back log and printed both checkpoints")
	}
	s.stop()
	if failures > 0 {
		fmt.Fprintf(os.Stderr, "%d failures\n", failures)
		os.Exit(1)
	}
	fmt.Println("PASS")
}
