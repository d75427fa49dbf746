package mysqltest

import (
	"testing"
)

func TestMain(m *testing.M) { Main(m) }

func TestNewGivesEachTestAnEmptyDatabase(t *testing.T) {
	a, b := New(t), New(t)
	if a.Name == b.Name {
		t.Fatalf("two databases share the name %q", a.Name)
	}
	dbA := a.Open(t)
	if _, err := dbA.Exec("CREATE TABLE x (id INT PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	var n int
	err := b.Open(t).QueryRow("SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE()").Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("a new database has %d tables, want 0", n)
	}
	var networking string
	if err := dbA.QueryRow("SELECT @@skip_networking").Scan(&networking); err != nil {
		t.Fatal(err)
	}
	if networking != "1" {
		t.Fatalf("@@skip_networking = %s, want 1: the test server must listen on its socket only", networking)
	}
}
