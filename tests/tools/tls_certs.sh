#!/usr/bin/env bash
# tls_certs.sh DIR: a throwaway PKI for the TLS tests, made with the openssl command (P-256
# keys, valid for 2 days), written into DIR:
#   ca.pem ca.key              the CA the tests trust (WICK_REDIS_CA_FILE)
#   server.pem server.key      signed by it, for the name localhost only (no IP address)
#   server-ip.pem server-ip.key  signed by it, for the address 127.0.0.1 only
#   client.pem client.key      signed by it, a client certificate (mutual TLS)
#   other-ca.pem               an unrelated CA, which signed none of them
#   expired.pem expired.key    signed by ca, for localhost, already expired
set -euo pipefail
d=${1:?usage: tls_certs.sh DIR}
mkdir -p "$d"
cd "$d"
ossl() { openssl "$@" 2>/dev/null; }
key() { ossl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1"; }

ca() { # NAME CN
  key "$1.key"
  ossl req -x509 -new -key "$1.key" -out "$1.pem" -days 2 -subj "/CN=$2" \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign
}

leaf() { # NAME CN EXTENSIONS [DAYS]
  key "$1.key"
  ossl req -new -key "$1.key" -out "$1.csr" -subj "/CN=$2"
  printf '%s\n' "$3" > "$1.ext"
  ossl x509 -req -in "$1.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -out "$1.pem" \
    -days "${4:-2}" -extfile "$1.ext"
  rm -f "$1.csr" "$1.ext"
}

ca ca "wick test CA"
ca other-ca "another CA"
leaf server "localhost" "subjectAltName=DNS:localhost
extendedKeyUsage=serverAuth"
leaf server-ip "127.0.0.1" "subjectAltName=IP:127.0.0.1
extendedKeyUsage=serverAuth"
leaf client "wick worker" "extendedKeyUsage=clientAuth"
leaf expired "localhost" "subjectAltName=DNS:localhost
extendedKeyUsage=serverAuth" -1 # not after: a day before it starts
chmod 600 ./*.key
