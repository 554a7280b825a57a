// Command tlogcheck checks modelstate's transparency-log primitives (base/
// merkle, signed_note, checkpoint) against Go's reference implementations in
// golang.org/x/mod/sumdb/note and golang.org/x/mod/sumdb/tlog, in both
// directions:
//
//   - what the C++ side makes (tree hashes, inclusion and consistency
//     proofs, signed checkpoints, a witness cosignature) must pass
//     tlog.TreeHash, tlog.CheckRecord, tlog.CheckTree, note.Open and
//     tlog.ParseTree, equal what tlog.ProveRecord and tlog.ProveTree make,
//     and fail them after a one-bit or one-byte change;
//   - what Go makes (notes signed with note.GenerateKey and note.Sign, proofs
//     from tlog, roots of its own records, a cosignature) must pass the C++
//     checks, and fail them after such a change.
//
// x/mod has no cosignature (signature type 0x04) code, so this program
// follows c2sp.org/tlog-cosignature with crypto/ed25519 itself.
//
// Usage: tlogcheck /path/to/tlog_tool
package main

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"

	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

const (
	cppRecords  = 300
	goRecords   = 90
	logOrigin   = "modelstate.example/audit"
	cosignAlg   = 0x04
	cosignTime  = 1690000000
	witnessName = "go.example/witness"
)

var failures int

func fail(format string, args ...interface{}) {
	failures++
	if failures <= 30 {
		fmt.Fprintf(os.Stderr, "FAIL: "+format+"\n", args...)
	}
}

func must(err error, what string) {
	if err != nil {
		fmt.Fprintf(os.Stderr, "tlogcheck: %s: %v\n", what, err)
		os.Exit(2)
	}
}

// ------------------------------------------------------------ helpers --

// memTree keeps the hashes tlog.StoredHashes asks a log to store.
type memTree struct {
	hashes []tlog.Hash
	n      int64
}

func (t *memTree) ReadHashes(indexes []int64) ([]tlog.Hash, error) {
	out := make([]tlog.Hash, len(indexes))
	for i, x := range indexes {
		if x < 0 || x >= int64(len(t.hashes)) {
			return nil, fmt.Errorf("hash %d not stored", x)
		}
		out[i] = t.hashes[x]
	}
	return out, nil
}

func (t *memTree) add(record []byte) {
	hs, err := tlog.StoredHashes(t.n, record, t)
	must(err, "StoredHashes")
	t.hashes = append(t.hashes, hs...)
	t.n++
}

// root is the RFC 6962 root: tlog.TreeHash, except that RFC 6962 (and so
// the C2SP checkpoint) gives the empty tree SHA-256 of nothing where Go
// uses all zeros.
func (t *memTree) root(n int64) tlog.Hash {
	if n == 0 {
		return sha256.Sum256(nil)
	}
	h, err := tlog.TreeHash(n, t)
	must(err, "TreeHash")
	return h
}

func decodeHash(s string) tlog.Hash {
	raw, err := base64.StdEncoding.DecodeString(s)
	if err != nil || len(raw) != tlog.HashSize {
		must(fmt.Errorf("%q", s), "bad hash from tlog_tool")
	}
	var h tlog.Hash
	copy(h[:], raw)
	return h
}

func decodeHashes(list []string) []tlog.Hash {
	out := make([]tlog.Hash, len(list))
	for i, s := range list {
		out[i] = decodeHash(s)
	}
	return out
}

func encodeHashes(list []tlog.Hash) []string {
	out := make([]string, len(list))
	for i, h := range list {
		out[i] = base64.StdEncoding.EncodeToString(h[:])
	}
	return out
}

func flipBit(h tlog.Hash, bit int) tlog.Hash {
	h[(bit/8)%tlog.HashSize] ^= 1 << (bit % 8)
	return h
}

func sameHashes(a, b []tlog.Hash) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// changeByte returns s with the byte at i replaced by another printable
// ASCII byte, so the note stays well-formed and only its content changes.
func changeByte(s string, i int) string {
	b := []byte(s)
	if b[i] == 'x' {
		b[i] = 'y'
	} else {
		b[i] = 'x'
	}
	return string(b)
}

func checkpointText(origin string, n int64, root tlog.Hash) string {
	return fmt.Sprintf("%s\n%d\n%s\n", origin, n,
		base64.StdEncoding.EncodeToString(root[:]))
}

func keyID(name string, typed []byte) uint32 {
	sum := sha256.Sum256(append([]byte(name+"\n"), typed...))
	return binary.BigEndian.Uint32(sum[:4])
}

// ------------------------------------------------- C++ output, Go checks --

type emitted struct {
	Records    []string `json:"records"`
	TreeHashes []string `json:"tree_hashes"`
	Inclusion  []struct {
		Index, Size int64
		Proof       []string
	} `json:"inclusion"`
	Consistency []struct {
		Old, New int64
		Proof    []string
	} `json:"consistency"`
	LogVkey         string   `json:"log_vkey"`
	WitnessVkey     string   `json:"witness_vkey"`
	Checkpoints     []string `json:"checkpoints"`
	GosumCheckpoint string   `json:"gosum_checkpoint"`
	Cosigned        string   `json:"cosigned"`
	CosignTime      uint64   `json:"cosign_time"`
}

func checkCppTree(e *emitted) *memTree {
	tree := &memTree{}
	for _, r := range e.Records {
		raw, err := base64.StdEncoding.DecodeString(r)
		must(err, "record base64")
		tree.add(raw)
	}
	if len(e.TreeHashes) != len(e.Records)+1 {
		fail("%d tree hashes for %d records", len(e.TreeHashes), len(e.Records))
	}
	for n, s := range e.TreeHashes {
		if got, want := decodeHash(s), tree.root(int64(n)); got != want {
			fail("C++ tree hash of size %d is %v; tlog.TreeHash says %v", n, got, want)
		}
	}
	return tree
}

func checkCppProofs(e *emitted, tree *memTree) {
	bit := 0
	for _, p := range e.Inclusion {
		proof := tlog.RecordProof(decodeHashes(p.Proof))
		th := tree.root(p.Size)
		leaf := tree.hashes[tlog.StoredHashIndex(0, p.Index)]
		if err := tlog.CheckRecord(proof, p.Size, th, p.Index, leaf); err != nil {
			fail("C++ inclusion proof %d in %d: tlog.CheckRecord: %v", p.Index, p.Size, err)
		}
		want, err := tlog.ProveRecord(p.Size, p.Index, tree)
		must(err, "ProveRecord")
		if !sameHashes(proof, want) {
			fail("C++ inclusion proof %d in %d differs from tlog.ProveRecord", p.Index, p.Size)
		}
		for i := range proof {
			bad := append(tlog.RecordProof{}, proof...)
			bad[i] = flipBit(bad[i], bit)
			bit++
			if tlog.CheckRecord(bad, p.Size, th, p.Index, leaf) == nil {
				fail("C++ inclusion proof %d in %d with hash %d altered still passes", p.Index, p.Size, i)
			}
		}
	}
	for _, p := range e.Consistency {
		proof := tlog.TreeProof(decodeHashes(p.Proof))
		oldRoot, newRoot := tree.root(p.Old), tree.root(p.New)
		if err := tlog.CheckTree(proof, p.New, newRoot, p.Old, oldRoot); err != nil {
			fail("C++ consistency proof %d to %d: tlog.CheckTree: %v", p.Old, p.New, err)
		}
		want, err := tlog.ProveTree(p.New, p.Old, tree)
		must(err, "ProveTree")
		if !sameHashes(proof, want) {
			fail("C++ consistency proof %d to %d differs from tlog.ProveTree", p.Old, p.New)
		}
		for i := range proof {
			bad := append(tlog.TreeProof{}, proof...)
			bad[i] = flipBit(bad[i], bit)
			bit++
			if tlog.CheckTree(bad, p.New, newRoot, p.Old, oldRoot) == nil {
				fail("C++ consistency proof %d to %d with hash %d altered still passes", p.Old, p.New, i)
			}
		}
	}
}

// checkCppCheckpoint opens one C++ checkpoint with note.Open and checks its
// body against the tree; a one-byte change anywhere in the text, or in the
// signature, must make note.Open fail.
func checkCppCheckpoint(msg string, verifiers note.Verifiers, tree *memTree) {
	n, err := note.Open([]byte(msg), verifiers)
	if err != nil {
		fail("note.Open of a C++ checkpoint: %v\n%s", err, msg)
		return
	}
	lines := strings.Split(strings.TrimSuffix(n.Text, "\n"), "\n")
	size, err := strconv.ParseInt(lines[1], 10, 64)
	if lines[0] != logOrigin || err != nil || size > tree.n {
		fail("C++ checkpoint body %q", n.Text)
		return
	}
	if root, want := decodeHash(lines[2]), tree.root(size); root != want {
		fail("C++ checkpoint of size %d has root %v; Go computes %v", size, root, want)
	}
	for i := 0; i+1 < len(n.Text); i++ {
		if _, err := note.Open([]byte(changeByte(msg, i)), verifiers); err == nil {
			fail("C++ checkpoint with byte %d changed still opens", i)
		}
	}
	sig := strings.LastIndex(msg, " ") + 10 // inside the signature base64
	if _, err := note.Open([]byte(changeByte(msg, sig)), verifiers); err == nil {
		fail("C++ checkpoint with its signature changed still opens")
	}
}

// parseCosignerKey reads a type-0x04 verifier key (note.NewVerifier knows
// only type 0x01).
func parseCosignerKey(vkey string) (name string, id uint32, pub ed25519.PublicKey) {
	parts := strings.SplitN(vkey, "+", 3)
	if len(parts) != 3 {
		must(fmt.Errorf("%q", vkey), "witness verifier key")
	}
	typed, err := base64.StdEncoding.DecodeString(parts[2])
	must(err, "witness verifier key base64")
	id64, err := strconv.ParseUint(parts[1], 16, 32)
	must(err, "witness key ID")
	if len(typed) != 33 || typed[0] != cosignAlg || uint32(id64) != keyID(parts[0], typed) {
		must(fmt.Errorf("%q", vkey), "witness verifier key type, length or ID")
	}
	return parts[0], uint32(id64), ed25519.PublicKey(typed[1:])
}

// verifyCosignature checks the cosignature line by (name, id) on an opened
// note per c2sp.org/tlog-cosignature and returns its time.
func verifyCosignature(n *note.Note, name string, id uint32, pub ed25519.PublicKey) (uint64, error) {
	for _, s := range n.UnverifiedSigs {
		if s.Name != name || s.Hash != id {
			continue
		}
		raw, err := base64.StdEncoding.DecodeString(s.Base64)
		if err != nil || len(raw) != 4+8+ed25519.SignatureSize {
			return 0, fmt.Errorf("cosignature is %d bytes", len(raw))
		}
		t := binary.BigEndian.Uint64(raw[4:12])
		msg := fmt.Sprintf("cosignature/v1\ntime %d\n%s", t, n.Text)
		if t > 1<<63-1 || !ed25519.Verify(pub, []byte(msg), raw[12:]) {
			return 0, fmt.Errorf("cosignature does not verify")
		}
		return t, nil
	}
	return 0, fmt.Errorf("no cosignature by %s+%08x", name, id)
}

func checkCppNotes(e *emitted, tree *memTree) {
	v, err := note.NewVerifier(e.LogVkey)
	if err != nil {
		fail("note.NewVerifier(%q): %v", e.LogVkey, err)
		return
	}
	verifiers := note.VerifierList(v)
	for _, msg := range e.Checkpoints {
		checkCppCheckpoint(msg, verifiers, tree)
	}
	n, err := note.Open([]byte(e.GosumCheckpoint), verifiers)
	if err != nil {
		fail("note.Open of the go.sum-origin checkpoint: %v", err)
	} else if t, err := tlog.ParseTree([]byte(n.Text)); err != nil || t.N != tree.n || t.Hash != tree.root(tree.n) {
		fail("tlog.ParseTree of the C++ checkpoint %q: %v %+v", n.Text, err, t)
	}
	// The cosigned checkpoint: the log's signature through note.Open, the
	// witness's by the spec.
	n, err = note.Open([]byte(e.Cosigned), verifiers)
	if err != nil {
		fail("note.Open of the cosigned checkpoint: %v", err)
		return
	}
	name, id, pub := parseCosignerKey(e.WitnessVkey)
	if t, err := verifyCosignature(n, name, id, pub); err != nil || t != e.CosignTime {
		fail("C++ cosignature: time %d, %v", t, err)
	}
	altered := *n
	altered.Text = changeByte(n.Text, len(n.Text)/2)
	if _, err := verifyCosignature(&altered, name, id, pub); err == nil {
		fail("C++ cosignature still verifies with a changed checkpoint")
	}
}

// --------------------------------------------------- Go output, C++ checks --

type item map[string]interface{}

// goItems builds what tlog_tool check must accept (expect true) and reject
// (expect false), all made by Go.
func goItems() (map[string][]item, map[string][2]int) {
	tree := &memTree{}
	var records []string
	for i := 0; i < goRecords; i++ {
		r := []byte(fmt.Sprintf("go record %d", i))
		r = append(r, bytes.Repeat([]byte{byte(i)}, i%5)...)
		tree.add(r)
		records = append(records, base64.StdEncoding.EncodeToString(r))
	}
	items := map[string][]item{}
	add := func(kind, what string, expect bool, it item) {
		it["what"], it["expect"] = what, expect
		items[kind] = append(items[kind], it)
	}

	var roots []tlog.Hash
	for n := int64(0); n <= tree.n; n++ {
		roots = append(roots, tree.root(n))
	}
	add("trees", "go roots", true, item{"records": records, "roots": encodeHashes(roots)})
	badRoots := append([]tlog.Hash{}, roots...)
	badRoots[goRecords/2] = flipBit(badRoots[goRecords/2], 77)
	add("trees", "go roots, one bit changed", false, item{"records": records, "roots": encodeHashes(badRoots)})

	addProofs(tree, add)
	addNotes(tree, add)

	counts := map[string][2]int{}
	for kind, list := range items {
		c := counts[kind]
		for _, it := range list {
			if it["expect"].(bool) {
				c[0]++
			} else {
				c[1]++
			}
		}
		counts[kind] = c
	}
	return items, counts
}

func addProofs(tree *memTree, add func(string, string, bool, item)) {
	sizes := []int64{64, 65, goRecords}
	for n := int64(1); n <= 40; n++ {
		sizes = append(sizes, n)
	}
	bit := 0
	for _, n := range sizes {
		root := tree.root(n)
		for m := int64(0); m < n; m++ {
			p, err := tlog.ProveRecord(n, m, tree)
			must(err, "ProveRecord")
			leaf := tree.hashes[tlog.StoredHashIndex(0, m)]
			what := fmt.Sprintf("go inclusion %d in %d", m, n)
			it := item{"leaf": encodeHashes([]tlog.Hash{leaf})[0], "index": m, "size": n,
				"root": encodeHashes([]tlog.Hash{root})[0], "proof": encodeHashes(p)}
			add("inclusion", what, true, it)
			bad := item{}
			for k, v := range it {
				bad[k] = v
			}
			bad["leaf"] = encodeHashes([]tlog.Hash{flipBit(leaf, bit)})[0]
			bit++
			add("inclusion", what+", leaf altered", false, bad)
			if len(p) > 0 {
				alt := append(tlog.RecordProof{}, p...)
				alt[int(m)%len(alt)] = flipBit(alt[int(m)%len(alt)], bit)
				bit++
				bad = item{}
				for k, v := range it {
					bad[k] = v
				}
				bad["proof"] = encodeHashes(alt)
				add("inclusion", what+", proof altered", false, bad)
			}
		}
		// From the empty tree: nothing to prove (Go's ProveTree starts at 1).
		add("consistency", fmt.Sprintf("go consistency 0 to %d", n), true,
			item{"old": 0, "new": n, "old_root": encodeHashes([]tlog.Hash{tree.root(0)})[0],
				"new_root": encodeHashes([]tlog.Hash{root})[0], "proof": []string{}})
		for m := int64(1); m <= n; m++ {
			p, err := tlog.ProveTree(n, m, tree)
			must(err, "ProveTree")
			what := fmt.Sprintf("go consistency %d to %d", m, n)
			it := item{"old": m, "new": n, "old_root": encodeHashes([]tlog.Hash{tree.root(m)})[0],
				"new_root": encodeHashes([]tlog.Hash{root})[0], "proof": encodeHashes(p)}
			add("consistency", what, true, it)
			if len(p) > 0 {
				alt := append(tlog.TreeProof{}, p...)
				alt[int(m)%len(alt)] = flipBit(alt[int(m)%len(alt)], bit)
				bit++
				bad := item{}
				for k, v := range it {
					bad[k] = v
				}
				bad["proof"] = encodeHashes(alt)
				add("consistency", what+", proof altered", false, bad)
			}
		}
	}
}

func addNotes(tree *memTree, add func(string, string, bool, item)) {
	skey, vkey, err := note.GenerateKey(rand.Reader, "go.example/log")
	must(err, "GenerateKey")
	signer, err := note.NewSigner(skey)
	must(err, "NewSigner")
	_, otherVkey, err := note.GenerateKey(rand.Reader, "go.example/log")
	must(err, "GenerateKey")
	text := checkpointText("go.example/log", tree.n, tree.root(tree.n))
	msg, err := note.Sign(&note.Note{Text: text}, signer)
	must(err, "Sign")
	signed := string(msg)
	add("notes", "go note", true, item{"vkey": vkey, "note": signed})
	for i := 0; i+1 < len(text); i++ {
		add("notes", fmt.Sprintf("go note, text byte %d changed", i), false,
			item{"vkey": vkey, "note": changeByte(signed, i)})
	}
	add("notes", "go note, signature changed", false,
		item{"vkey": vkey, "note": changeByte(signed, len(signed)-10)})
	add("notes", "go note, another key of the same name", false,
		item{"vkey": otherVkey, "note": signed})
	// Two signatures; the C++ side knows only the second key.
	skey2, vkey2, err := note.GenerateKey(rand.Reader, "go.example/mirror")
	must(err, "GenerateKey")
	signer2, err := note.NewSigner(skey2)
	must(err, "NewSigner")
	msg2, err := note.Sign(&note.Note{Text: "two signers\n\nand a blank line\n"}, signer, signer2)
	must(err, "Sign")
	add("notes", "go note with two signers", true, item{"vkey": vkey2, "note": string(msg2)})

	// A cosignature made by the spec, on the Go-signed checkpoint.
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	must(err, "ed25519.GenerateKey")
	typed := append([]byte{cosignAlg}, pub...)
	id := keyID(witnessName, typed)
	witnessVkey := fmt.Sprintf("%s+%08x+%s", witnessName, id, base64.StdEncoding.EncodeToString(typed))
	cosigned := func(t uint64) string {
		sig := make([]byte, 12)
		binary.BigEndian.PutUint32(sig, id)
		binary.BigEndian.PutUint64(sig[4:], t)
		sig = append(sig, ed25519.Sign(priv, []byte(fmt.Sprintf("cosignature/v1\ntime %d\n%s", t, text)))...)
		return signed + "— " + witnessName + " " + base64.StdEncoding.EncodeToString(sig) + "\n"
	}
	good := cosigned(cosignTime)
	base := item{"log_vkey": vkey, "witness_vkey": witnessVkey, "time": cosignTime}
	with := func(msg string, time uint64) item {
		it := item{}
		for k, v := range base {
			it[k] = v
		}
		it["note"], it["time"] = msg, time
		return it
	}
	add("cosigned", "go cosignature", true, with(good, cosignTime))
	add("cosigned", "go cosignature, checkpoint changed", false, with(changeByte(good, 3), cosignTime))
	add("cosigned", "go cosignature, signature changed", false, with(changeByte(good, len(good)-10), cosignTime))
	// The time in the line changed: the signature covers it.
	line := strings.LastIndex(good, " ") + 1
	raw, _ := base64.StdEncoding.DecodeString(strings.TrimSuffix(good[line:], "\n"))
	raw[11] ^= 1
	add("cosigned", "go cosignature, time changed", false,
		with(good[:line]+base64.StdEncoding.EncodeToString(raw)+"\n", cosignTime^1))
}

func runCppChecks(tool string) {
	items, counts := goItems()
	input, err := json.Marshal(items)
	must(err, "json")
	cmd := exec.Command(tool, "check")
	cmd.Stdin = bytes.NewReader(input)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		fail("tlog_tool check: %v\n%s%s", err, out, stderr.String())
		return
	}
	// The tool must have looked at every item: its pass/fail counts are
	// exactly the expected ones.
	for kind, c := range counts {
		want := fmt.Sprintf("%s passed %d failed %d\n", kind, c[0], c[1])
		if !strings.Contains(string(out), want) {
			fail("tlog_tool check printed\n%s\nwithout %q", out, want)
		}
	}
	fmt.Printf("C++ checked Go's items:\n%s", out)
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: tlogcheck /path/to/tlog_tool")
		os.Exit(2)
	}
	tool := os.Args[1]
	out, err := exec.Command(tool, "emit", strconv.Itoa(cppRecords)).Output()
	must(err, "tlog_tool emit")
	var e emitted
	must(json.Unmarshal(out, &e), "tlog_tool emit output")
	tree := checkCppTree(&e)
	checkCppProofs(&e, tree)
	checkCppNotes(&e, tree)
	fmt.Printf("Go checked C++'s output: %d tree hashes, %d inclusion and %d consistency proofs, %d checkpoints and a cosignature\n",
		len(e.TreeHashes), len(e.Inclusion), len(e.Consistency), len(e.Checkpoints)+2)
	runCppChecks(tool)
	if failures > 0 {
		fmt.Fprintf(os.Stderr, "tlogcheck: %d failures\n", failures)
		os.Exit(1)
	}
	fmt.Println("PASS")
}
