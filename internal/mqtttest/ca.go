package mqtttest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// CA is a certificate authority for one test: it signs server and client
// certificates and revocation lists, written as PEM files into its dir.
type CA struct {
	Dir  string
	File string // the CA's PEM certificate
	Cert *x509.Certificate
	key  *ecdsa.PrivateKey
	crl  int64
}

// NewCA makes a CA named name with its files in dir.
func NewCA(t testing.TB, dir, name string) *CA {
	t.Helper()
	ca := &CA{Dir: dir}
	key, der := ca.issue(t, &x509.Certificate{
		Subject: pkix.Name{CommonName: name}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}, time.Now().Add(24*time.Hour))
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	ca.Cert, ca.key = cert, key
	ca.File = ca.write(t, name+"-ca.pem", "CERTIFICATE", der)
	return ca
}

// issue signs tmpl (self-signed while the CA has no key) with a fresh key.
func (ca *CA) issue(t testing.TB, tmpl *x509.Certificate, notAfter time.Time) (*ecdsa.PrivateKey, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		t.Fatal(err)
	}
	tmpl.SerialNumber, tmpl.NotBefore, tmpl.NotAfter = serial, notAfter.Add(-48*time.Hour), notAfter
	parent, signer := tmpl, key
	if ca.Cert != nil {
		parent, signer = ca.Cert, ca.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, signer)
	if err != nil {
		t.Fatal(err)
	}
	return key, der
}

func (ca *CA) write(t testing.TB, name, typ string, der []byte) string {
	t.Helper()
	p := filepath.Join(ca.Dir, name)
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// Leaf is a certificate the CA issued, with its files.
type Leaf struct {
	CertFile, KeyFile string
	Cert              *x509.Certificate
}

// LeafOptions shape a certificate: a server's is for 127.0.0.1 and
// localhost; NotAfter zero is a day from now.
type LeafOptions struct {
	Server   bool
	NotAfter time.Time
	DNSNames []string
}

// Leaf issues a certificate with common name name, written as name.pem and
// name.key.
func (ca *CA) Leaf(t testing.TB, name string, o LeafOptions) Leaf {
	t.Helper()
	tmpl := &x509.Certificate{Subject: pkix.Name{CommonName: name}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, DNSNames: o.DNSNames}
	if o.Server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
		tmpl.DNSNames = append(tmpl.DNSNames, "localhost")
	}
	if o.NotAfter.IsZero() {
		o.NotAfter = time.Now().Add(24 * time.Hour)
	}
	key, der := ca.issue(t, tmpl, o.NotAfter)
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return Leaf{CertFile: ca.write(t, name+".pem", "CERTIFICATE", der), KeyFile: ca.write(t, name+".key", "PRIVATE KEY", kder), Cert: cert}
}

// CRL writes a revocation list of the given certificates into file (in the
// CA's dir) and returns its path.
func (ca *CA) CRL(t testing.TB, file string, revoked ...*x509.Certificate) string {
	t.Helper()
	ca.crl++
	tmpl := &x509.RevocationList{Number: big.NewInt(ca.crl), ThisUpdate: time.Now().Add(-time.Minute), NextUpdate: time.Now().Add(24 * time.Hour)}
	for _, c := range revoked {
		tmpl.RevokedCertificateEntries = append(tmpl.RevokedCertificateEntries, x509.RevocationListEntry{SerialNumber: c.SerialNumber, RevocationTime: time.Now().Add(-time.Minute)})
	}
	der, err := x509.CreateRevocationList(rand.Reader, tmpl, ca.Cert, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return ca.write(t, file, "X509 CRL", der)
}

// ClientTLS is a client config that trusts the server CA and presents
// leaf (none when leaf is the zero Leaf) whatever CAs the server names, as
// a device with one certificate does.
func ClientTLS(t testing.TB, serverCA *CA, leaf Leaf) *tls.Config {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AddCert(serverCA.Cert)
	c := &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
	if leaf.CertFile != "" {
		pair, err := tls.LoadX509KeyPair(leaf.CertFile, leaf.KeyFile)
		if err != nil {
			t.Fatal(err)
		}
		c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &pair, nil }
	}
	return c
}
