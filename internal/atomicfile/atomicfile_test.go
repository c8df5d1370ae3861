package atomicfile

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestWriteFunc(t *testing.T) {
	errWriter := errors.New("encoder failed")
	tests := []struct {
		name     string
		old      string // content before the write; "" for no file
		oldPerm  os.FileMode
		write    func(io.Writer) error
		perm     os.FileMode
		wantErr  error  // errors.Is the error returned; nil for success
		wantFile string // content after the write
		wantPerm os.FileMode
	}{
		{
			name:     "creates",
			write:    content("new"),
			perm:     0o600,
			wantFile: "new",
			wantPerm: 0o600,
		},
		{
			name:     "overwrites",
			old:      "old content, longer than the new",
			oldPerm:  0o600,
			write:    content("new"),
			perm:     0o600,
			wantFile: "new",
			wantPerm: 0o600,
		},
		{
			name:     "sets the mode asked for, not the old file's",
			old:      "old",
			oldPerm:  0o600,
			write:    content("cert"),
			perm:     0o644,
			wantFile: "cert",
			wantPerm: 0o644,
		},
		{
			name:     "the mode is not narrowed by umask",
			write:    content("x"),
			perm:     0o666,
			wantFile: "x",
			wantPerm: 0o666,
		},
		{
			name:    "a failed write leaves the old file",
			old:     "old",
			oldPerm: 0o644,
			write: func(w io.Writer) error {
				io.WriteString(w, "half of the new")
				return errWriter
			},
			perm:     0o600,
			wantErr:  errWriter,
			wantFile: "old",
			wantPerm: 0o644,
		},
		{
			name: "a failed first write leaves no file",
			write: func(io.Writer) error {
				return errWriter
			},
			perm:    0o600,
			wantErr: errWriter,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "state")
			if tt.old != "" {
				if err := os.WriteFile(path, []byte(tt.old), tt.oldPerm); err != nil {
					t.Fatal(err)
				}
				if err := os.Chmod(path, tt.oldPerm); err != nil {
					t.Fatal(err)
				}
			}
			err := WriteFunc(path, tt.perm, tt.write)
			if !errors.Is(err, tt.wantErr) || (err == nil) != (tt.wantErr == nil) {
				t.Fatalf("WriteFunc: got error %v, want %v", err, tt.wantErr)
			}
			checkFile(t, path, tt.wantFile, tt.wantPerm)
			onlyFile(t, dir, tt.wantFile != "")
		})
	}
}

func TestWrite(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "epoch")
	for _, s := range []string{"1\n", "22\n", "3\n"} {
		if err := Write(path, []byte(s), 0o600); err != nil {
			t.Fatalf("Write %q: %v", s, err)
		}
		checkFile(t, path, s, 0o600)
	}
	onlyFile(t, dir, true)
}

// TestWriteErrors: a write that cannot start says which file it was for and
// wraps the cause, so callers can test it with errors.Is.
func TestWriteErrors(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name string
		path string
		want error
	}{
		{"missing directory", filepath.Join(dir, "no-such-dir", "state"), fs.ErrNotExist},
		{"directory is a file", filepath.Join(regular(t, dir), "state"), syscall.ENOTDIR},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Write(tt.path, []byte("x"), 0o600)
			if !errors.Is(err, tt.want) {
				t.Fatalf("got %v, want an error wrapping %v", err, tt.want)
			}
			if !strings.Contains(err.Error(), tt.path) {
				t.Fatalf("error %q does not name the file %s", err, tt.path)
			}
		})
	}
}

// TestWriteOverADirectory: the rename fails, and the temporary file goes.
func TestWriteOverADirectory(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "taken")
	if err := os.Mkdir(path, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := Write(path, []byte("x"), 0o600); err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("got %v, want an error naming %s", err, path)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || !entries[0].IsDir() {
		t.Fatalf("directory holds %v, want only the directory %s", names(entries), path)
	}
}

func content(s string) func(io.Writer) error {
	return func(w io.Writer) error {
		_, err := io.WriteString(w, s)
		return err
	}
}

func regular(t *testing.T, dir string) string {
	t.Helper()
	p := filepath.Join(dir, "file")
	if err := os.WriteFile(p, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// checkFile fails t unless path holds want with mode perm; want "" means
// path must not exist.
func checkFile(t *testing.T, path, want string, perm os.FileMode) {
	t.Helper()
	b, err := os.ReadFile(path)
	if want == "" {
		if !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("%s: got %q, %v; want no file", path, b, err)
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != want {
		t.Fatalf("%s holds %q, want %q", path, b, want)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := fi.Mode().Perm(); got != perm {
		t.Fatalf("%s has mode %v, want %v", path, got, perm)
	}
}

// onlyFile fails t if dir holds anything but the target: no temporary file
// may be left behind, whatever happened.
func onlyFile(t *testing.T, dir string, exists bool) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := 0
	if exists {
		want = 1
	}
	if len(entries) != want {
		t.Fatalf("directory holds %v, want %d file(s): a temporary file was left behind", names(entries), want)
	}
}

func names(entries []os.DirEntry) []string {
	var s []string
	for _, e := range entries {
		s = append(s, e.Name())
	}
	return s
}
